package memagent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// Client is a caller's client of one node's agent; it satisfies
// coord.Agent.
type Client struct {
	c      *Cluster
	caller string
	node   string
	term   agentv1.Term
}

// WithTerm returns the client of a coordinator of the given term, which
// the node checks as the real agent does (agentv1.TermHeader).
func (cl *Client) WithTerm(term agentv1.Term) *Client {
	out := *cl
	out.term = term
	return &out
}

func (cl *Client) call(ctx context.Context, op, what string, fn func(n *Node) error) error {
	return cl.c.call(ctx, cl.caller, cl.node, op, what, func(n *Node) error {
		if cl.term.Older(n.term) {
			return &agentv1.Error{Code: agentv1.CodeStaleTerm, Message: fmt.Sprintf("coordinator term %s, but term %s has called node %s", cl.term, n.term, n.name)}
		}
		n.term = cl.term
		return fn(n)
	})
}

func rankWhat(r agentv1.Rank) string { return "r" + strconv.Itoa(r.Rank) }

func ranksWhat(rs []agentv1.Rank) string {
	var b []byte
	for i, r := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, rankWhat(r)...)
	}
	return string(b)
}

func ckptWhat(r agentv1.Rank, seq int) string { return rankWhat(r) + " ckpt=" + strconv.Itoa(seq) }

// Close does nothing: a Client holds nothing.
func (cl *Client) Close() {}

// JobNet sets the job's network on the node.
func (cl *Client) JobNet(ctx context.Context, req agentv1.JobNet) error {
	return cl.call(ctx, "jobnet", remotesWhat(req), func(n *Node) error { return n.setNet(req) })
}

// setNet sets the job's network on the node, as the real agent's
// ensureJobNet (netw's SetRemotes) does for JobNet and before it runs,
// restores or takes in a rank: no remote rank at this node's own address
// (this model used to take it), and a rank whose address is attached
// here cannot be remote. Both are the agent's answer, internal (this
// model's refusal used to be no answer at all, which the coordinator
// takes for an unreachable agent; and a restore or migration here used
// to set the network without the check, so a rank left attached on a
// node went unseen).
func (n *Node) setNet(req agentv1.JobNet) error {
	for _, a := range slices.Sorted(maps.Keys(req.Remotes)) {
		if req.Remotes[a] == n.underlay {
			return apiErr(agentv1.CodeInternal, "rank %s listed as remote at this node's own address %s", a, n.underlay)
		}
	}
	for _, ct := range n.ctrs {
		if ct.attached && ct.vni == req.VNI {
			if _, ok := req.Remotes[ct.Addr]; ok {
				return apiErr(agentv1.CodeInternal, "rank %s is attached to this node (its container %s), not remote", ct.Addr, ct.Name)
			}
		}
	}
	n.nets[req.VNI] = req
	return nil
}

// DeleteJobNet removes the job's network from the node; the addresses
// of ranks still on it stay taken, as the real agent's rank network
// namespaces stay.
func (cl *Client) DeleteJobNet(ctx context.Context, vni uint32) error {
	return cl.call(ctx, "drop-jobnet", "", func(n *Node) error {
		delete(n.nets, vni)
		return nil
	})
}

// RankRun starts a rank.
func (cl *Client) RankRun(ctx context.Context, req agentv1.RankRun) (agentv1.Container, error) {
	var out agentv1.Container
	err := cl.call(ctx, "run", rankWhat(req.Rank), func(n *Node) error {
		name := agentv1.RankName(req.Job, req.Rank.Rank)
		// As the real agent, which takes the rank's address on the node
		// (its network namespace) before it makes the container: a rank
		// started again is refused for its address, internal (this model
		// used to answer exists).
		for _, ct := range n.ctrs {
			if ct.attached && ct.vni == req.Net.VNI && ct.Addr == req.Addr {
				return apiErr(agentv1.CodeInternal, "netns of rank %s of job network %d already exists", req.Addr, req.Net.VNI)
			}
		}
		if ct := n.ctrs[name]; ct != nil {
			return apiErr(agentv1.CodeExists, "container %s exists", name)
		}
		if err := n.setNet(req.Net); err != nil {
			return err
		}
		ct := &Container{Name: name, Job: req.Job, Rank: req.Rank.Rank, Addr: req.Addr, Status: agentv1.StatusRunning, Incarnation: 1,
			vni: req.Net.VNI, attached: true}
		n.ctrs[name] = ct
		out = wire(ct)
		return nil
	})
	return out, err
}

// RankRestore restores a rank frozen and locked from its image in the
// node's store or, lazily or from the stream, from its holders; it
// replaces a container of the same name.
func (cl *Client) RankRestore(ctx context.Context, req agentv1.RankRestore) (agentv1.Container, error) {
	var out agentv1.Container
	err := cl.call(ctx, "restore", restoreWhat(req), func(n *Node) error {
		name := agentv1.RankName(req.Job, req.Rank.Rank)
		key := imageKey{name, req.Seq}
		switch {
		case n.images[key] && n.damaged[key]:
			return apiErr(agentv1.CodeCorrupt, "image %s:%d: damaged chunk", name, req.Seq)
		case n.images[key]:
		case len(req.Lazy) > 0:
			var holders []string
			for _, h := range req.Lazy {
				holders = append(holders, h.Node)
			}
			if _, err := n.holder(key, holders); err != nil {
				return fmt.Errorf("lazy restore of %s:%d: %w", name, req.Seq, err)
			}
		case len(req.Stream) > 0:
			var holders []string
			for _, h := range req.Stream {
				holders = append(holders, h.Node)
			}
			if _, err := n.holder(key, holders); err != nil {
				return fmt.Errorf("restore of %s:%d from the stream: %w", name, req.Seq, err)
			}
		case req.Tier != nil:
			if err := cl.c.tierHas(*req.Tier, key); err != nil {
				return fmt.Errorf("lazy restore of %s:%d from the durable tier: %w", name, req.Seq, err)
			}
		default:
			return apiErr(agentv1.CodeNotFound, "no checkpoint %s:%d", name, req.Seq)
		}
		if err := n.setNet(req.Net); err != nil {
			return err
		}
		n.dropPending(name)
		inc := 1
		if old := n.ctrs[name]; old != nil {
			old.stopHold()
			inc = old.Incarnation + 1
		}
		ct := &Container{Name: name, Job: req.Job, Rank: req.Rank.Rank, Addr: req.Addr, Status: agentv1.StatusPaused, Locked: true,
			RestoredFrom: req.Seq, Incarnation: inc, vni: req.Net.VNI, attached: true}
		n.ctrs[name] = ct
		out = wire(ct)
		return nil
	})
	return out, err
}

// RankResume unlocks and thaws ranks.
func (cl *Client) RankResume(ctx context.Context, req agentv1.RankResume) error {
	return cl.call(ctx, "resume", ranksWhat(req.Ranks), func(n *Node) error {
		var errs []error
		for _, r := range req.Ranks {
			ct := n.ctrs[r.Name()]
			if ct == nil {
				errs = append(errs, notFound(r.Name()))
				continue
			}
			ct.stopHold()
			n.thaw(ct)
		}
		return errors.Join(errs...)
	})
}

// RankRemove removes a rank's container (Keep: stops it, keeping its
// dir), and frees its address on the node (the coordinator always names
// it); a missing one is not an error.
func (cl *Client) RankRemove(ctx context.Context, req agentv1.RankRemove) error {
	return cl.call(ctx, "remove", removeWhat(req), func(n *Node) error {
		n.remove(req.Name(), req.Keep)
		return nil
	})
}

func (n *Node) remove(name string, keep bool) {
	n.dropPending(name)
	ct := n.ctrs[name]
	if ct == nil {
		return
	}
	ct.stopHold()
	if keep {
		// As the real agent, whose stop kills the rank: it has exited by
		// SIGKILL, unless it had ended before (this model used to call it
		// stopped).
		switch {
		case ct.frozenEnded != "":
			ct.Status, ct.frozenEnded = ct.frozenEnded, ""
		case ct.Status.Live():
			ct.Status, ct.ExitCode = agentv1.StatusExited, 128+9
		}
		ct.Locked, ct.attached = false, false
		return
	}
	delete(n.ctrs, name)
}

// RankStall locks and freezes ranks for a hold; all or nothing.
func (cl *Client) RankStall(ctx context.Context, req agentv1.RankStall) error {
	return cl.call(ctx, "stall", ranksWhat(req.Ranks), func(n *Node) error {
		for _, r := range req.Ranks {
			if n.ctrs[r.Name()] == nil {
				return notFound(r.Name())
			}
		}
		for _, r := range req.Ranks {
			ct := n.ctrs[r.Name()]
			ct.stopHold()
			// As the real agent, which freezes what is left of a rank that
			// has ended (it reads paused) until the resume, after which it
			// has ended again (this model used to resume it running).
			if !ct.Status.Live() {
				ct.frozenEnded = ct.Status
			}
			ct.Status, ct.Locked, ct.Held = agentv1.StatusPaused, true, true
			ct.hold = n.later(n.hold(req.Hold), func() {
				if n.ctrs[ct.Name] == ct && ct.Held {
					ct.Held, ct.hold = false, nil
					n.thaw(ct)
				}
			})
		}
		return nil
	})
}

// Prepare locks, freezes and "dumps" a rank, and keeps it so until Commit,
// Abort or the end of the hold.
func (cl *Client) Prepare(ctx context.Context, req agentv1.Prepare) (agentv1.Prepared, error) {
	var out agentv1.Prepared
	err := cl.call(ctx, "prepare", ckptWhat(req.Rank, req.Seq), func(n *Node) error {
		name := req.Name()
		key := imageKey{name, req.Seq}
		ct := n.ctrs[name]
		if ct == nil {
			return notFound(name)
		}
		if ct.Status != agentv1.StatusRunning && ct.Status != agentv1.StatusPaused {
			return apiErr(agentv1.CodeNotRunning, "container %s is %s", name, ct.Status)
		}
		if n.pending[key] != nil {
			return apiErr(agentv1.CodeExists, "%s:%d is already prepared", name, req.Seq)
		}
		// As the real agent: an abort that came first gives the rank up
		// (this model used to forget such aborts, and held the rank
		// frozen until the end of its hold).
		if _, ok := n.aborted[key]; ok {
			delete(n.aborted, key)
			return apiErr(agentv1.CodeNoSuchRound, "%s:%d was aborted while it prepared", name, req.Seq)
		}
		ct.Status, ct.Locked = agentv1.StatusPaused, true
		p := &prepared{}
		hold := n.hold(req.Hold)
		p.thaw = n.later(hold, func() {
			if n.pending[key] == p {
				n.thaw(ct)
			}
		})
		// As the real agent, the image of a prepare nobody decided goes
		// PendingTTL after the hold (this model used to keep it for good).
		p.expire = n.later(hold+n.c.opts.PendingTTL, func() {
			if n.pending[key] == p {
				delete(n.pending, key)
			}
		})
		n.pending[key] = p
		out = agentv1.Prepared{Size: 1 << 20, Dump: time.Millisecond}
		return nil
	})
	return out, err
}

// Commit stores a prepared rank's image and thaws the rank, or with Stop
// ends it (checkpointed, its network locked); a commit sent again for an
// image already stored answers the stored checkpoint, and one with Stop
// ends the rank whatever it answers.
func (cl *Client) Commit(ctx context.Context, req agentv1.Finish) (agentv1.Committed, error) {
	var out agentv1.Committed
	err := cl.call(ctx, "commit", ckptWhat(req.Rank, req.Seq), func(n *Node) error {
		name := req.Name()
		key := imageKey{name, req.Seq}
		p := n.pending[key]
		if ct := n.ctrs[name]; req.Stop && ct != nil && (ct.Status.Live() || ct.frozenEnded != "") {
			ct.stopHold()
			ct.Status, ct.frozenEnded, ct.Locked = agentv1.StatusCheckpointed, "", true
		}
		if p == nil {
			if n.images[key] {
				// As the real agent (this model used to answer nothing).
				out.Checkpoint = checkpoint(key)
				return nil
			}
			return apiErr(agentv1.CodeNoSuchRound, "%s:%d is not prepared on this node", name, req.Seq)
		}
		p.stop()
		delete(n.pending, key)
		n.images[key] = true
		if ct := n.ctrs[name]; ct != nil && !req.Stop {
			n.thaw(ct)
		}
		out.Checkpoint = checkpoint(key)
		return nil
	})
	return out, err
}

// checkpoint is what a node says of its stored image key.
func checkpoint(key imageKey) agentv1.Checkpoint {
	return agentv1.Checkpoint{Container: key.name, Seq: key.seq, Size: 1 << 20}
}

// Abort drops a prepare and thaws its rank; an unknown one is not an
// error, but is remembered for PendingTTL: a prepare of it yet to come
// gives its rank up.
func (cl *Client) Abort(ctx context.Context, req agentv1.Finish) error {
	return cl.call(ctx, "abort", ckptWhat(req.Rank, req.Seq), func(n *Node) error {
		key := imageKey{req.Name(), req.Seq}
		p := n.pending[key]
		if p == nil {
			n.rememberAbort(key)
			return nil
		}
		p.stop()
		delete(n.pending, key)
		if ct := n.ctrs[key.name]; ct != nil {
			n.thaw(ct)
		}
		return nil
	})
}

// Fetch copies an image from a holder the node reaches, or repairs the
// node's damaged copy from one.
func (cl *Client) Fetch(ctx context.Context, req agentv1.Fetch) (agentv1.Image, error) {
	var out agentv1.Image
	err := cl.call(ctx, "fetch", req.Container+":"+strconv.Itoa(req.Seq), func(n *Node) error {
		key := imageKey{req.Container, req.Seq}
		// As the real agent, the answer names the image, and says whether
		// it was copied (this model used to answer neither).
		out.Checkpoint = checkpoint(key)
		if n.images[key] && !n.damaged[key] {
			return nil
		}
		holders := []string{req.FromNode}
		for _, h := range req.Also {
			holders = append(holders, h.Node)
		}
		src, err := n.holder(key, holders)
		if err != nil {
			return fmt.Errorf("fetch %s:%d: %w", req.Container, req.Seq, err)
		}
		if n.damaged[key] {
			delete(n.damaged, key)
			out.Repaired = 1
		}
		n.images[key] = true
		out.Fetched, out.Bytes = true, 1<<20
		out.Holders = []agentv1.HolderShare{{Node: src.name, Bytes: out.Bytes}}
		return nil
	})
	return out, err
}

// MigrateIn pulls a rank prepared on another node and restores it here,
// frozen and locked, for a hold after which it is removed.
func (cl *Client) MigrateIn(ctx context.Context, req agentv1.MigrateIn) (agentv1.MigratedIn, error) {
	var out agentv1.MigratedIn
	err := cl.call(ctx, "move-in", ckptWhat(req.Rank, req.Seq)+" from="+req.FromNode, func(n *Node) error {
		name := req.Name()
		key := imageKey{name, req.Seq}
		// As the real agent, a source that does not answer makes the
		// target's answer internal (this model's used to be no answer,
		// which the coordinator takes for an unreachable target).
		src, ok := n.c.reachable(n.name, req.FromNode)
		var staged bool
		if ok {
			n.peek(src, func() { ok, staged = src.up, src.pending[key] != nil })
		}
		if !ok {
			return apiErr(agentv1.CodeInternal, "migrate %s from %s: %v", name, req.FromNode, ErrUnreachable)
		}
		if !staged {
			return apiErr(agentv1.CodeNotFound, "no prepared image %s:%d on %s", name, req.Seq, req.FromNode)
		}
		if err := n.setNet(req.Net); err != nil {
			return err
		}
		if old := n.ctrs[name]; old != nil {
			old.stopHold()
		}
		ct := &Container{Name: name, Job: req.Job, Rank: req.Rank.Rank, Addr: req.Addr, Status: agentv1.StatusPaused, Locked: true, Held: true, Incarnation: 1,
			vni: req.Net.VNI, attached: true}
		ct.hold = n.later(n.hold(req.Hold), func() {
			if n.ctrs[name] == ct && ct.Held {
				delete(n.ctrs, name) // it must never run beside the source
			}
		})
		n.ctrs[name] = ct
		out = agentv1.MigratedIn{Bytes: 1 << 20, Move: time.Millisecond, Restore: time.Millisecond}
		return nil
	})
	return out, err
}

// MigrateOut removes a rank that moved away, without unlocking it.
func (cl *Client) MigrateOut(ctx context.Context, req agentv1.MigrateOut) error {
	return cl.call(ctx, "move-out", ckptWhat(req.Rank, req.Seq), func(n *Node) error {
		name := req.Name()
		if p := n.pending[imageKey{name, req.Seq}]; p != nil {
			p.stop()
			delete(n.pending, imageKey{name, req.Seq})
		}
		if ct := n.ctrs[name]; ct != nil {
			ct.stopHold()
			delete(n.ctrs, name)
		}
		return nil
	})
}

// DropImages drops every image of the containers, or only those of
// req.Seqs.
func (cl *Client) DropImages(ctx context.Context, req agentv1.DropImages) (agentv1.Dropped, error) {
	var out agentv1.Dropped
	err := cl.call(ctx, "drop-images", "", func(n *Node) error {
		for k := range n.images {
			for _, name := range req.Containers {
				if k.name == name && (len(req.Seqs) == 0 || slices.Contains(req.Seqs, k.seq)) {
					delete(n.images, k)
					out.Images++
				}
			}
		}
		return nil
	})
	return out, err
}

// Kill ends a container's processes with signal sig.
func (cl *Client) Kill(ctx context.Context, name string, sig int) error {
	return cl.call(ctx, "kill", name, func(n *Node) error {
		// As the real agent: a signal must be one (this model used to
		// take 0 for SIGKILL), and only a live container can be killed
		// (this model used to kill an ended one again). The kill leaves
		// the rank's network and its hold as they are (this model used to
		// unlock it and drop its hold).
		if sig <= 0 || sig > 64 {
			return apiErr(agentv1.CodeBadRequest, "kill needs a container name and ?signal=N")
		}
		ct := n.ctrs[name]
		if ct == nil {
			return notFound(name)
		}
		if !ct.Status.Live() {
			return apiErr(agentv1.CodeNotRunning, "container is not running: %s is %s", name, ct.Status)
		}
		ct.Status, ct.ExitCode, ct.frozenEnded = agentv1.StatusExited, 128+sig, ""
		return nil
	})
}

// Get describes a container.
func (cl *Client) Get(ctx context.Context, name string) (agentv1.Container, error) {
	var out agentv1.Container
	err := cl.call(ctx, "get", name, func(n *Node) error {
		ct := n.ctrs[name]
		if ct == nil {
			return notFound(name)
		}
		out = wire(ct)
		return nil
	})
	return out, err
}

func wire(ct *Container) agentv1.Container {
	out := agentv1.Container{Name: ct.Name, Status: ct.Status, Addr: ct.Addr}
	if ct.RestoredFrom != 0 {
		out.RestoredFrom = ct.Name + ":" + strconv.Itoa(ct.RestoredFrom)
	}
	if ct.Status == agentv1.StatusExited || ct.frozenEnded == agentv1.StatusExited {
		code := ct.ExitCode
		out.ExitCode = &code
	}
	return out
}

func restoreWhat(req agentv1.RankRestore) string {
	s := ckptWhat(req.Rank, req.Seq)
	if len(req.Lazy) > 0 {
		s += " lazy"
	}
	if len(req.Stream) > 0 {
		s += " stream"
	}
	return s
}

func removeWhat(req agentv1.RankRemove) string {
	if req.Keep {
		return rankWhat(req.Rank) + " keep"
	}
	return rankWhat(req.Rank)
}

// remotesWhat lists where a job network sends each remote address, in
// address order.
func remotesWhat(j agentv1.JobNet) string {
	addrs := make([]string, 0, len(j.Remotes))
	for a := range j.Remotes {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	for i, a := range addrs {
		addrs[i] = a + ">" + j.Remotes[a]
	}
	return strings.Join(addrs, ",")
}
