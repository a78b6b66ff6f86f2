package coord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord/machine"
)

// jobRun performs the actions of one run of a job's protocol machine
// (start, restart, migration) on the job's nodes, and records its phases
// with persist.
type jobRun struct {
	c   *Coordinator
	log *slog.Logger
	job *coordv1.Job // the job's record when the run began
	// ckpt is the checkpoint a restart restores, or the number of a
	// migration (its image is staged under it).
	ckpt int
	// placement is where the job's ranks are (restart: where they are
	// restored).
	placement []string
	nodes     map[string]coordv1.Node // every node of the catalog, by name
	underlays map[string]string       // their underlay addresses
	persist   func(ctx context.Context, p machine.Persist) error
	// run is the request that starts a rank (job start).
	run func(rank int) agentv1.RankRun
	// hold is how long agents keep stalled or moved ranks (migration).
	hold time.Duration
	// postCopy: the migration moves the rank without its memory
	// (coordv1.Migrate.PostCopy).
	postCopy bool
	// observe, if set, sees every agent call and its Result.
	observe func(a machine.Action, res machine.Result)

	// sent counts the agent calls performed, by action, so that a call
	// the machine sends again (an idempotent one that failed) waits
	// first: a node cut off for a moment is reached by a later try.
	sent map[string]int

	netsOnce sync.Once
	nets     map[string]agentv1.JobNet // the job network by node, for x.placement

	mu        sync.Mutex
	tierCkpt  *coordv1.TierCkpt  // the ckpt's record in the durable tier, once read
	prepared  agentv1.Prepared   // the migrating rank's prepare
	movedIn   agentv1.MigratedIn // its move
	resumedAt time.Time          // when the first resume was sent
}

// jobRuns drives the protocols that run a whole job on its nodes (start
// and restart, by package machine), and its kill and teardown.
type jobRuns struct{ c *Coordinator }

// newJobRun returns a run for j, with the catalog's nodes.
func (jr *jobRuns) newJobRun(ctx context.Context, j *coordv1.Job, log *slog.Logger) (*jobRun, error) {
	c := jr.c
	nodes, err := c.rec.allNodes(ctx)
	if err != nil {
		return nil, err
	}
	return &jobRun{c: c, log: log, job: j, placement: j.Placement, nodes: nodes, underlays: underlaysOf(nodes)}, nil
}

// drive runs m to its end.
func (x *jobRun) drive(ctx context.Context, m interface {
	Step(time.Time, machine.Event) ([]machine.Action, error)
}) (machine.Done, error) {
	end, err := drive(ctx, machineRun[machine.Event, machine.Action]{
		step: m.Step,
		kind: func(a machine.Action) actionKind {
			switch a.(type) {
			case machine.Done:
				return final
			case machine.Persist, machine.Failpoint:
				return inline
			}
			if machine.Background(a) {
				return inline // it starts its own background work
			}
			return concurrent
		},
		perform: x.perform,
		log:     x.log,
	}, machine.Event(machine.Start{}))
	done, _ := end.(machine.Done)
	return done, err
}

func (x *jobRun) rank(r int) agentv1.Rank { return agentv1.Rank{Job: x.job.Name, Rank: r} }

// jobNet is the job network as node sees it with the ranks on placement.
func (x *jobRun) jobNet(node string, placement []string) agentv1.JobNet {
	j := *x.job
	j.Placement = placement
	return jobNet(&j, node, x.underlays)
}

// ownNet is the job network as node sees it with the ranks on
// x.placement. A job of 10,000 ranks makes a map of every remote rank for
// each of its nodes: they are made once, all at once, from one map of
// every rank.
func (x *jobRun) ownNet(node string) agentv1.JobNet {
	x.netsOnce.Do(func() {
		all := make(map[string]string, len(x.placement))
		for r, on := range x.placement {
			if u := x.underlays[on]; u != "" {
				all[x.job.Addrs[r]] = u
			}
		}
		nodes, ranks := byNode(x.placement)
		x.nets = make(map[string]agentv1.JobNet, len(nodes))
		for _, n := range nodes {
			remotes := maps.Clone(all)
			for _, r := range ranks[n] {
				delete(remotes, x.job.Addrs[r])
			}
			x.nets[n] = agentv1.JobNet{Job: x.job.Name, VNI: x.job.VNI, Subnet: x.job.Subnet, Remotes: remotes}
		}
	})
	if n, ok := x.nets[node]; ok {
		return n
	}
	return x.jobNet(node, x.placement)
}

// byNode groups the ranks of placement by node.
func byNode(placement []string) ([]string, map[string][]int) {
	ranks := map[string][]int{}
	for r, n := range placement {
		ranks[n] = append(ranks[n], r)
	}
	return slices.Sorted(maps.Keys(ranks)), ranks
}

// perform does one action and returns its Result.
func (x *jobRun) perform(ctx context.Context, a machine.Action) (machine.Event, bool) {
	res := machine.Result{Action: a}
	switch a := a.(type) {
	case machine.Persist:
		x.c.trace(x.job.Name, a.String())
		res.Err = x.persist(ctx, a)
		if res.Err != nil {
			x.log.Warn("record a phase", "phase", a.Phase, "err", res.Err)
		}
		return res, true
	case machine.Failpoint:
		x.c.trace(x.job.Name, a.String())
		x.c.hold(ctx, a.Name)
		return res, true
	case machine.FetchImage:
		// Only in the background: a rank restored from the stream leaves
		// its node's store a copy.
		x.c.background(func(ctx context.Context) { x.fetchCopy(ctx, a) })
		return nil, false
	case machine.RepairCopy:
		if a.Background {
			x.c.background(func(ctx context.Context) {
				_ = x.c.repl.repairCopy(ctx, x.job.Name, x.ckpt, a.Rank, a.Node, a.From, x.nodes, true)
			})
			return nil, false
		}
		x.log.Warn("damaged image at restore; repairing it from another copy", "rank", a.Rank, "node", a.Node, "peer", strings.Join(a.From, ","))
		res.Err = x.c.repl.repairCopy(ctx, x.job.Name, x.ckpt, a.Rank, a.Node, a.From, x.nodes, false)
		return res, true
	}
	if wait := x.resendWait(a); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			res.Err = ctx.Err()
			return res, true
		}
	}
	node := actionNode(a)
	cl, err := x.c.agents.client(ctx, node)
	if err != nil {
		res.Err = err
		return res, true
	}
	res.Err = x.call(ctx, cl, a, &res)
	res.Corrupt = isCorrupt(res.Err)
	if x.observe != nil {
		x.observe(a, res)
	}
	if res.Err != nil {
		x.log.Info("agent call failed", "node", node, "call", a.String(), "err", res.Err)
	}
	return res, true
}

// call makes the agent call of a on cl, filling res with what it tells.
func (x *jobRun) call(ctx context.Context, cl Agent, a machine.Action, res *machine.Result) error {
	j := x.job
	switch a := a.(type) {
	case machine.RunRank:
		_, err := cl.RankRun(ctx, x.run(a.Rank))
		return err
	case machine.QueryRank:
		in, err := cl.Get(ctx, agentv1.RankName(j.Name, a.Rank))
		if hasCode(err, agentv1.CodeNotFound) {
			return nil // res.Status "": the node has no such rank
		}
		res.Status = string(in.Status)
		return err
	case machine.RemoveRank:
		return cl.RankRemove(ctx, agentv1.RankRemove{Rank: x.rank(a.Rank), VNI: j.VNI, Addr: j.Addrs[a.Rank], Keep: a.Keep})
	case machine.FetchTier:
		src, err := x.tierSource(ctx, cl, a.Rank)
		if err != nil {
			return err
		}
		img, err := cl.TierFetch(ctx, agentv1.TierFetch{URL: src.URL, ImageRef: agentv1.ImageRef{Container: agentv1.RankName(j.Name, a.Rank), Seq: x.ckpt}, Record: src.Record})
		if err != nil {
			return err
		}
		x.log.Info("fetched from the durable tier for restart", "rank", a.Rank, "node", a.Node, "bytes", img.Bytes, "took", img.Duration)
		return x.c.rec.addCopy(ctx, j.Name, x.ckpt, a.Rank, a.Node, nil)
	case machine.RestoreRank:
		req := agentv1.RankRestore{Rank: x.rank(a.Rank), Net: x.ownNet(a.Node), Addr: j.Addrs[a.Rank], Seq: x.ckpt}
		for _, h := range a.Lazy {
			req.Lazy = append(req.Lazy, agentv1.Holder{Addr: x.nodes[h].Addr, Node: h})
		}
		for _, h := range a.Stream {
			req.Stream = append(req.Stream, agentv1.Holder{Addr: x.nodes[h].Addr, Node: h})
		}
		if a.Tier {
			src, err := x.tierSource(ctx, cl, a.Rank)
			if err != nil {
				return err
			}
			req.Tier = &src
		}
		out, err := cl.RankRestore(ctx, req)
		for _, sh := range out.Holders {
			if sh.Damaged {
				res.Damaged = append(res.Damaged, sh.Node)
			}
		}
		return err
	case machine.ResumeRanks:
		x.mu.Lock()
		if x.resumedAt.IsZero() {
			x.resumedAt = time.Now()
		}
		x.mu.Unlock()
		return cl.RankResume(ctx, agentv1.RankResume{Ranks: x.ranks(a.Ranks)})
	case machine.StallRanks:
		return cl.RankStall(ctx, agentv1.RankStall{Ranks: x.ranks(a.Ranks), Hold: x.hold})
	case machine.PrepareRank:
		out, err := cl.Prepare(ctx, agentv1.Prepare{Rank: x.rank(a.Rank), Seq: x.ckpt, Hold: x.hold, MemoryWait: x.c.migs.memoryWait()})
		x.mu.Lock()
		x.prepared = out
		x.mu.Unlock()
		return err
	case machine.AbortPrepare:
		return cl.Abort(ctx, agentv1.Finish{Rank: x.rank(a.Rank), Seq: x.ckpt})
	case machine.MoveIn:
		moved := append([]string(nil), x.placement...)
		moved[a.Rank] = a.Node
		out, err := cl.MigrateIn(ctx, agentv1.MigrateIn{Rank: x.rank(a.Rank), Seq: x.ckpt, From: x.nodes[a.From].Addr, FromNode: a.From,
			Net: x.jobNet(a.Node, moved), Addr: j.Addrs[a.Rank], Hold: x.hold, PostCopy: x.postCopy})
		x.mu.Lock()
		x.movedIn = out
		x.mu.Unlock()
		return err
	case machine.MoveOut:
		return cl.MigrateOut(ctx, agentv1.MigrateOut{Rank: x.rank(a.Rank), Seq: x.ckpt, VNI: j.VNI, Addr: j.Addrs[a.Rank], Donor: x.postCopy})
	case machine.SetJobNet:
		return cl.JobNet(ctx, x.jobNet(a.Node, a.Placement))
	case machine.DropJobNet:
		return cl.DeleteJobNet(ctx, j.VNI)
	}
	return fmt.Errorf("no agent call for %s", a)
}

// tierSource is where rank's image of the ckpt is in the job's durable
// tier: the tier's record of the ckpt, read through cl the first time and
// checked, gives it.
func (x *jobRun) tierSource(ctx context.Context, cl Agent, rank int) (agentv1.TierSource, error) {
	repo := coordv1.TierRepo(x.job.Tier, x.job.Name)
	x.mu.Lock()
	rec := x.tierCkpt
	x.mu.Unlock()
	if rec == nil {
		var err error
		if rec, err = readTierCkpt(ctx, cl, repo, x.job.Name, x.ckpt); err != nil {
			return agentv1.TierSource{}, err
		}
		x.mu.Lock()
		x.tierCkpt = rec
		x.mu.Unlock()
	}
	if rank >= len(rec.Images) {
		return agentv1.TierSource{}, fmt.Errorf("the tier's record of %s:%d has no rank %d", x.job.Name, x.ckpt, rank)
	}
	return agentv1.TierSource{URL: repo, Record: rec.Images[rank].Record}, nil
}

func (x *jobRun) ranks(rs []int) []agentv1.Rank {
	out := make([]agentv1.Rank, len(rs))
	for i, r := range rs {
		out[i] = x.rank(r)
	}
	return out
}

// actionNode is the node whose agent an action calls.
func actionNode(a machine.Action) string {
	switch a := a.(type) {
	case machine.RunRank:
		return a.Node
	case machine.QueryRank:
		return a.Node
	case machine.RemoveRank:
		return a.Node
	case machine.FetchImage:
		return a.Node
	case machine.FetchTier:
		return a.Node
	case machine.RestoreRank:
		return a.Node
	case machine.ResumeRanks:
		return a.Node
	case machine.StallRanks:
		return a.Node
	case machine.PrepareRank:
		return a.Node
	case machine.AbortPrepare:
		return a.Node
	case machine.MoveIn:
		return a.Node
	case machine.MoveOut:
		return a.Node
	case machine.SetJobNet:
		return a.Node
	case machine.DropJobNet:
		return a.Node
	}
	return ""
}

// underlaysOf maps node names to their underlay addresses.
func underlaysOf(nodes map[string]coordv1.Node) map[string]string {
	out := make(map[string]string, len(nodes))
	for name, n := range nodes {
		out[name] = n.Underlay
	}
	return out
}

// doneErr is the error of a run that ended badly: its failures, which
// wrap the agents' errors and so keep their codes.
func doneErr(d machine.Done) error {
	switch {
	case d.OK:
		return nil
	case d.Err != nil:
		return d.Err
	}
	return errors.New(d.Reason)
}

// resendFirst is the wait before an agent call is sent a second time; each
// later try waits twice as long as the one before.
const resendFirst = 2 * time.Second

// resendWait is how long to wait before sending a: nothing the first time.
func (x *jobRun) resendWait(a machine.Action) time.Duration {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.sent == nil {
		x.sent = map[string]int{}
	}
	k := a.String()
	x.sent[k]++
	if n := x.sent[k]; n > 1 {
		return resendFirst << (n - 2)
	}
	return 0
}

// fetchCopy has a.Node fetch its copy of the rank's image from a.From, at
// the lowest priority, for a rank restored there from the stream.
func (x *jobRun) fetchCopy(ctx context.Context, a machine.FetchImage) {
	cl, err := x.c.agents.client(ctx, a.Node)
	if err == nil {
		var img agentv1.Image
		img, _, err = fetchImage(ctx, cl, x.job.Name, x.ckpt, a.Rank, a.From, x.nodes, agentv1.Fetch{Background: true})
		if err == nil {
			x.log.Info("fetched for restart", "rank", a.Rank, "node", a.Node, "peer", strings.Join(sentBy(img), ","),
				"bytes", img.Bytes, "took", img.Duration)
			return
		}
	}
	x.log.Warn("the copy of a rank restored from the stream could not be stored", "rank", a.Rank, "node", a.Node, "err", err)
}
