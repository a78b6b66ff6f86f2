package coord

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
)

// replicaTargets picks up to want nodes for new copies of an image whose
// copies are on have: never a node that has one, nodes of failure domains
// (label "rack") without a copy first, then the ring order of node names
// starting after the image's first holder. The ring (rather than random)
// placement spreads each node's replicas over its successors, which makes
// restarts after simultaneous failures more likely (docs/planning.md).
func replicaTargets(have []string, want int, live []coordv1.Node) []string {
	if want <= 0 || len(have) == 0 {
		return nil
	}
	sorted := slices.Clone(live)
	sort.Slice(sorted, func(a, b int) bool { return sorted[a].Name < sorted[b].Name })
	start := 0
	for i, n := range sorted {
		if n.Name > have[0] {
			start = i
			break
		}
		if i == len(sorted)-1 {
			start = 0
		}
	}
	racks := map[string]bool{}
	rackOf := map[string]string{}
	for _, n := range sorted {
		rackOf[n.Name] = n.Labels["rack"]
	}
	for _, h := range have {
		racks[rackOf[h]] = true
	}
	var ring []coordv1.Node
	for i := range sorted {
		n := sorted[(start+i)%len(sorted)]
		if !slices.Contains(have, n.Name) {
			ring = append(ring, n)
		}
	}
	var out []string
	for pass := 0; pass < 2 && len(out) < want; pass++ {
		for _, n := range ring {
			if len(out) == want {
				break
			}
			if slices.Contains(out, n.Name) {
				continue
			}
			if pass == 0 && rackOf[n.Name] != "" && racks[rackOf[n.Name]] {
				continue // another rack first
			}
			out = append(out, n.Name)
			racks[rackOf[n.Name]] = true
		}
	}
	return out
}

// liveCopies returns the copies of a rank image on live nodes, in order.
func liveCopies(r coordv1.CkptRank, live map[string]coordv1.Node) []string {
	var out []string
	for _, n := range copiesOf(r) {
		if _, ok := live[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

// copiesOf is where a rank image is: its copies, or where it was taken for
// a record from before copies were tracked; none for an image taken on
// another cluster (imported from the durable tier) until a node fetches
// it.
func copiesOf(r coordv1.CkptRank) []string {
	if len(r.Copies) > 0 || r.Node == "" {
		return r.Copies
	}
	return []string{r.Node}
}

// replicator brings the rank images of durable checkpoints to their jobs'
// replica counts, and repairs damaged copies.
type replicator struct {
	c *Coordinator
	// ckpts has one replication of a checkpoint run at a time: a repair
	// that a node's loss starts while the checkpoint's copies are being
	// made waits for them, then makes what they left missing, instead of
	// fetching the same images onto the same nodes beside them.
	ckpts jobLocks
}

// replicate brings every rank image of a checkpoint to the job's replica
// count on live nodes: each missing copy is fetched by its target node from
// a live holder (the receiver verifies every chunk, and the copy counts
// only once it is complete). It then marks the checkpoint protected if
// every rank has its copies, or durable if not.
func (rp *replicator) replicate(ctx context.Context, job string, seq int) error {
	c := rp.c
	unlock := rp.ckpts.lock(ckptKey(job, seq))
	defer unlock()
	j, err := c.rec.job(ctx, job)
	if err != nil {
		return err
	}
	var ck coordv1.Ckpt
	if _, err := c.cat.Get(ctx, ckptKey(job, seq), &ck); err != nil {
		return err
	}
	if ck.State != coordv1.CkptDurable && ck.State != coordv1.CkptProtected {
		return nil
	}
	c.hold(ctx, "before-replication")
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return err
	}
	var liveList []coordv1.Node
	for _, n := range live {
		liveList = append(liveList, n)
	}
	// Every rank's missing copies at once; each rank's one after another
	// (a new copy is a holder for the next).
	err = fanOut(ck.Ranks, func(r coordv1.CkptRank) error {
		have := liveCopies(r, live)
		if len(have) == 0 {
			return errors.New("no live copy")
		}
		var errs []error
		for _, t := range replicaTargets(have, j.Replicas+1-len(have), liveList) {
			if err := rp.copyImage(ctx, job, seq, r.Rank, have, t, live, j.ReplicationRate); err != nil {
				errs = append(errs, err)
				continue
			}
			have = append(have, t)
		}
		return errors.Join(errs...)
	}, func(r coordv1.CkptRank) string { return fmt.Sprintf("rank %d", r.Rank) })
	return errors.Join(err, rp.updateProtection(ctx, job, seq, j.Replicas))
}

// copyImage has node fetch a rank's image from all the live holders at
// once (a holder that fails or serves damage hands its share to the
// others), and records the copy. A holder whose copy turned out damaged
// is repaired from the new one.
func (rp *replicator) copyImage(ctx context.Context, job string, seq, rank int, holders []string, to string, live map[string]coordv1.Node, rate int64) error {
	c := rp.c
	cl, err := c.agents.client(ctx, to)
	if err != nil {
		return err
	}
	start := time.Now()
	img, damaged, err := fetchImage(ctx, cl, job, seq, rank, holders, live, agentv1.Fetch{Rate: rate, Background: true})
	from := strings.Join(holders, ",")
	if err != nil {
		c.log.Warn("replication", "job", job, "ckpt", seq, "rank", rank, "node", to, "peer", from, "err", err)
		c.publish(evv1.Event{Type: evv1.ReplicaFailed, Job: job, Ckpt: seq, Rank: evv1.IntPtr(rank), Node: to, Peer: from, Message: err.Error()})
		return fmt.Errorf("copy %s:%d rank %d from %s to %s: %w", job, seq, rank, from, to, err)
	}
	from = strings.Join(sentBy(img), ",")
	c.log.Info("replicated", "job", job, "ckpt", seq, "rank", rank, "node", to, "peer", from,
		"bytes", img.Bytes, "took", time.Since(start))
	c.publish(evv1.Event{Type: evv1.ReplicaCopied, Job: job, Ckpt: seq, Rank: evv1.IntPtr(rank), Node: to, Peer: from,
		Bytes: img.Bytes, Duration: time.Since(start)})
	err = c.rec.addCopy(ctx, job, seq, rank, to, func(ck *coordv1.Ckpt) { noteCopy(ck, start, time.Now(), img.Bytes) })
	for _, bad := range damaged {
		_ = rp.repairCopy(ctx, job, seq, rank, bad, []string{to}, live, true)
	}
	return err
}

// fetchImage has cl fetch a rank's image from all of holders at once (f
// gives the rest of the request) and returns what it got and the holders
// that served damage.
func fetchImage(ctx context.Context, cl Agent, job string, seq, rank int, holders []string, live map[string]coordv1.Node, f agentv1.Fetch) (agentv1.Image, []string, error) {
	if len(holders) == 0 {
		return agentv1.Image{}, nil, fmt.Errorf("no live copy of %s:%d rank %d", job, seq, rank)
	}
	f.Container, f.Seq = agentv1.RankName(job, rank), seq
	f.From, f.FromNode = live[holders[0]].Addr, holders[0]
	for _, h := range holders[1:] {
		f.Also = append(f.Also, agentv1.Holder{Addr: live[h].Addr, Node: h})
	}
	img, err := cl.Fetch(ctx, f)
	var damaged []string
	for _, sh := range img.Holders {
		if sh.Damaged {
			damaged = append(damaged, sh.Node)
		}
	}
	return img, damaged, err
}

// sentBy lists the holders that sent a fetched image anything.
func sentBy(img agentv1.Image) []string {
	var out []string
	for _, sh := range img.Holders {
		if sh.Bytes > 0 {
			out = append(out, sh.Node)
		}
	}
	return out
}

// hasCode reports whether err is an agent's (or the coordinator's) error
// of the given code.
func hasCode(err error, code string) bool {
	var we *agentv1.Error
	return errors.As(err, &we) && we.Code == code
}

// isCorrupt reports whether an agent refused data as damaged.
func isCorrupt(err error) bool { return hasCode(err, agentv1.CodeCorrupt) }

// repairCopy has node read its copy of a rank image in full and fetch
// again, from one of the other holders, whatever of it is damaged (in the
// background, unless a restart waits for it). It returns nil once node's
// copy is intact.
func (rp *replicator) repairCopy(ctx context.Context, job string, seq, rank int, node string, others []string, live map[string]coordv1.Node, background bool) error {
	c := rp.c
	cl, err := c.agents.client(ctx, node)
	if err != nil {
		return err
	}
	var errs []error
	for _, from := range others {
		if from == node {
			continue
		}
		img, err := cl.Fetch(ctx, agentv1.Fetch{Container: agentv1.RankName(job, rank), Seq: seq, From: live[from].Addr, FromNode: from, Repair: true, Background: background})
		if err != nil {
			errs = append(errs, fmt.Errorf("repair %s:%d rank %d on %s from %s: %w", job, seq, rank, node, from, err))
			continue
		}
		if img.Repaired > 0 || img.RepairedManifest {
			c.log.Warn("damaged copy repaired", "job", job, "ckpt", seq, "rank", rank, "node", node, "peer", from,
				"chunks", img.Repaired, "manifest", img.RepairedManifest, "bytes", img.Bytes)
			c.publish(evv1.Event{Type: evv1.ReplicaRepaired, Job: job, Ckpt: seq, Rank: evv1.IntPtr(rank), Node: node, Peer: from,
				Bytes: img.Bytes, Message: fmt.Sprintf("%d damaged chunks replaced (manifest: %v)", img.Repaired, img.RepairedManifest)})
		}
		return nil
	}
	if len(errs) == 0 {
		return fmt.Errorf("repair %s:%d rank %d on %s: no other copy", job, seq, rank, node)
	}
	return errors.Join(errs...)
}

// updateProtection sets a durable checkpoint protected when every rank has
// 1+k copies on live nodes, and a protected one back to durable when not.
func (rp *replicator) updateProtection(ctx context.Context, job string, seq, k int) error {
	c := rp.c
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return err
	}
	var ck coordv1.Ckpt
	var was coordv1.CkptState
	err = c.cat.Update(ctx, ckptKey(job, seq), &ck, func() error {
		was = ck.State
		if ck.State != coordv1.CkptDurable && ck.State != coordv1.CkptProtected {
			return nil
		}
		protected := true
		for _, r := range ck.Ranks {
			if len(liveCopies(r, live)) < 1+k {
				protected = false
			}
		}
		if protected {
			ck.State = coordv1.CkptProtected
		} else {
			ck.State = coordv1.CkptDurable
		}
		return nil
	})
	if err == nil && was != ck.State && ck.State == coordv1.CkptProtected {
		c.publish(evv1.Event{Type: evv1.CkptProtected, Job: job, Ckpt: seq, Message: fmt.Sprintf("%d copies of every rank image", 1+k)})
	}
	return err
}

// isDamaged reports whether an agent said a dump left a rank unusable.
func isDamaged(err error) bool { return hasCode(err, agentv1.CodeDamaged) }

// repair re-creates the copies that dead nodes took with them, for every
// durable checkpoint of every job.
func (rp *replicator) repair(ctx context.Context) {
	c := rp.c
	jobs, err := c.Jobs(ctx)
	if err != nil {
		return
	}
	for _, j := range jobs {
		cks, err := c.rec.ckpts(ctx, j.Name)
		if err != nil {
			continue
		}
		for _, ck := range cks {
			if ck.State != coordv1.CkptDurable && ck.State != coordv1.CkptProtected {
				continue
			}
			if err := rp.replicate(ctx, j.Name, ck.Seq); err != nil && ctx.Err() == nil {
				c.log.Warn("repair incomplete", "job", j.Name, "ckpt", ck.Seq, "err", err)
			}
		}
	}
}

// SetSpare marks a node as a spare or not.
func (c *Coordinator) SetSpare(ctx context.Context, name string, spare bool) (*coordv1.Node, error) {
	var n coordv1.Node
	err := c.cat.Update(ctx, nodeKey(name), &n, func() error {
		n.Spare = spare
		return nil
	})
	if errors.Is(err, catalog.ErrNotFound) {
		return nil, apiErr(agentv1.CodeNotFound, "no node %s", name)
	}
	return &n, err
}
