package coord

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	agentv1 "cairn/api/agent/v1"
	v1 "cairn/api/coord/v1"
	evv1 "cairn/api/events/v1"
	"cairn/internal/failpoint"
	"cairn/internal/rpc"
)

// restorable picks the checkpoint to restart from: number from, or the
// newest durable (or protected) one whose every rank image has a copy on a
// live node.
func restorable(cks []v1.Ckpt, from int, live map[string]v1.Node) (*v1.Ckpt, error) {
	for i := len(cks) - 1; i >= 0; i-- {
		ck := &cks[i]
		if from != 0 && ck.Seq != from {
			continue
		}
		if ck.State != v1.CkptDurable && ck.State != v1.CkptProtected {
			if from != 0 {
				return nil, apiErr(v1.CodeNoCkpt, "checkpoint %s:%d is %s, not durable", ck.Job, ck.Seq, ck.State)
			}
			continue
		}
		var missing []string
		for _, r := range ck.Ranks {
			if len(liveCopies(r, live)) == 0 {
				missing = append(missing, fmt.Sprintf("rank %d (on %v)", r.Rank, copiesOf(r)))
			}
		}
		if len(missing) == 0 {
			return ck, nil
		}
		if from != 0 {
			return nil, apiErr(v1.CodeNoCkpt, "checkpoint %s:%d cannot be restored: no live copy of %v", ck.Job, ck.Seq, missing)
		}
	}
	if from != 0 {
		return nil, apiErr(v1.CodeNoCkpt, "no checkpoint %d", from)
	}
	return nil, apiErr(v1.CodeNoCkpt, "no durable checkpoint with every rank image on a live node")
}

// Restart restarts a whole job from a checkpoint: what is left of the job
// is removed; every target node fetches its ranks' images from the nodes
// that hold them and restores them frozen, with their network locked, all
// in parallel; once every rank is restored, all are resumed together.
// Ranks keep their addresses wherever they land.
func (c *Coordinator) Restart(ctx context.Context, name string, req v1.Restart) (*v1.Job, error) {
	return c.restart(ctx, name, req, false)
}

// restart is Restart; with ifLost, only if a rank's node is dead (several
// nodes dying at once each ask for a restart: the first one does it).
func (c *Coordinator) restart(ctx context.Context, name string, req v1.Restart, ifLost bool) (*v1.Job, error) {
	defer c.lockJob(name)()
	start := time.Now()
	j, err := c.job(ctx, name)
	if err != nil {
		return nil, err
	}
	if ifLost {
		live, err := c.liveNodes(ctx)
		if err != nil {
			return nil, err
		}
		lost := false
		for _, n := range j.Placement {
			if _, ok := live[n]; !ok {
				lost = true
			}
		}
		if !lost || (j.State != v1.JobRunning && j.State != v1.JobFailed) {
			return j, nil
		}
	}
	cks, err := c.ckpts(ctx, name)
	if err != nil {
		return nil, err
	}
	live, err := c.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	ck, err := restorable(cks, req.From, live)
	if err != nil {
		return nil, err
	}
	// Restarts may use spares: that is what they are for.
	cands, err := c.candidates(ctx, req.Nodes, true)
	if err != nil {
		return nil, err
	}
	// Keep a rank where it is if a copy of its image is there, else where
	// a copy is; ranks whose copies are all gone with their nodes' go to
	// spares first, then to the least loaded nodes.
	copies := make([][]string, len(ck.Ranks))
	prefer := make([]string, len(ck.Ranks))
	for i, r := range ck.Ranks {
		copies[i] = liveCopies(r, live)
		prefer[i] = copies[i][0]
		if i < len(j.Placement) && slices.Contains(copies[i], j.Placement[i]) {
			prefer[i] = j.Placement[i]
		}
	}
	// Each rank's current node is no longer loaded by it.
	for i := range cands {
		for _, n := range j.Placement {
			if cands[i].Name == n && cands[i].Ranks > 0 {
				cands[i].Ranks--
			}
		}
	}
	var placement []string
	if len(req.Placement) > 0 {
		if len(req.Placement) != len(ck.Ranks) {
			return nil, apiErr(agentv1.CodeBadRequest, "placement names %d nodes for %d ranks", len(req.Placement), len(ck.Ranks))
		}
		if _, err := c.candidates(ctx, req.Placement, true); err != nil {
			return nil, err
		}
		placement = req.Placement
	} else if placement, err = place(len(ck.Ranks), j.PerNode, cands, prefer); err != nil {
		return nil, err
	}
	c.publish(evv1.Event{Type: evv1.JobRestarting, Job: name, Ckpt: ck.Seq, Message: "onto " + strings.Join(placement, ",")})
	// Stop what is left of the job.
	old := *j
	c.teardownRanks(ctx, &old, placement)
	j, err = c.updateJob(ctx, name, func(j *v1.Job) error {
		j.Placement, j.State, j.Reason, j.RestartFrom = placement, v1.JobRestarting, "", ck.Seq
		return nil
	})
	if err != nil {
		return nil, err
	}
	underlays := c.underlays(ctx)
	nodes := map[string]v1.Node{}
	for _, n := range cands {
		nodes[n.Name] = n
	}
	for n, v := range live {
		nodes[n] = v
	}
	lazy := j.LazyRestore
	if req.Lazy != nil {
		lazy = *req.Lazy
	}
	err = c.forRanks(ctx, j, func(ctx context.Context, cl *rpc.AgentClient, r int) error {
		restore := agentv1.RankRestore{
			Rank: agentv1.Rank{Job: name, Rank: r}, Net: jobNet(j, placement[r], underlays),
			Addr: j.Addrs[r], Seq: ck.Seq,
		}
		if lazy && !slices.Contains(copies[r], placement[r]) {
			// The node restores the rank from every live copy while it
			// runs (agent: lazy.go).
			for _, h := range copies[r] {
				restore.Lazy = append(restore.Lazy, agentv1.Holder{Addr: nodes[h].Addr, Node: h})
			}
		} else if !slices.Contains(copies[r], placement[r]) {
			// From every live copy at once: the receiver verifies every
			// chunk, and a damaged or unreachable copy hands its share to
			// the others.
			img, damaged, err := fetchImage(ctx, cl, name, ck.Seq, r, copies[r], nodes, agentv1.Fetch{})
			if err != nil {
				return err
			}
			c.log.Info("fetched for restart", "job", name, "rank", r, "to", placement[r], "from", strings.Join(sentBy(img), ","),
				"bytes", img.Bytes, "took", img.Duration)
			// Sources that sent damaged data are repaired from the good
			// copy, after the restart.
			for _, src := range damaged {
				bg := context.WithoutCancel(ctx)
				if c.runCtx != nil {
					bg = c.runCtx // it belongs to the coordinator, not to a request
				}
				c.wg.Add(1)
				go func() {
					defer c.wg.Done()
					_ = c.repairCopy(bg, name, ck.Seq, r, src, []string{placement[r]}, nodes, true)
				}()
			}
		}
		_, err := cl.RankRestore(ctx, restore)
		if isCorrupt(err) {
			// The copy here is damaged: the restore found it before CRIU
			// ran. Replace what is damaged from another copy and retry.
			c.log.Warn("damaged image at restore; repairing it from another copy", "job", name, "rank", r, "node", placement[r], "err", err)
			if rerr := c.repairCopy(ctx, name, ck.Seq, r, placement[r], copies[r], nodes, false); rerr != nil {
				return errors.Join(err, rerr)
			}
			_, err = cl.RankRestore(ctx, restore)
		}
		return err
	})
	if err != nil {
		c.teardownRanks(context.WithoutCancel(ctx), j, nil)
		reason := err.Error()
		_, _ = c.updateJob(context.WithoutCancel(ctx), name, func(j *v1.Job) error {
			j.State, j.Reason = v1.JobFailed, reason
			return nil
		})
		c.publish(evv1.Event{Type: evv1.JobRestartFailed, Job: name, Ckpt: ck.Seq, Message: reason})
		return nil, fmt.Errorf("restart %s from checkpoint %d: %w", name, ck.Seq, err)
	}
	failpoint.Hold(ctx, "restart-before-resume", c.log)
	// Every rank is restored, frozen: resume them all, one call per node.
	if err := c.resumeRanks(ctx, ranksByNode(name, placement, -1)); err != nil {
		return nil, err
	}
	// The job network is gone from nodes the job left.
	for _, n := range old.Placement {
		if _, ok := live[n]; ok && !slices.Contains(placement, n) {
			if cl, err := c.client(ctx, n); err == nil {
				_ = cl.DeleteJobNet(ctx, j.VNI)
			}
		}
	}
	c.mu.Lock()
	c.lastRun[name] = time.Now()
	c.mu.Unlock()
	c.log.Info("job restarted", "job", name, "ckpt", ck.Seq, "placement", placement, "took", time.Since(start))
	c.publish(evv1.Event{Type: evv1.JobRestarted, Job: name, Ckpt: ck.Seq, Duration: time.Since(start), Message: "on " + strings.Join(placement, ",")})
	return c.updateJob(ctx, name, func(j *v1.Job) error {
		j.State, j.Restarts, j.RestoredFrom, j.RestartFrom = v1.JobRunning, j.Restarts+1, ck.Seq, 0
		return nil
	})
}

// ranksByNode groups a job's ranks by the node of placement they are on,
// leaving out rank skip (-1: none).
func ranksByNode(job string, placement []string, skip int) map[string][]agentv1.Rank {
	out := map[string][]agentv1.Rank{}
	for r, n := range placement {
		if r != skip {
			out[n] = append(out[n], agentv1.Rank{Job: job, Rank: r})
		}
	}
	return out
}

// resumeRanks unlocks and thaws ranks, one call per node, all nodes at
// once.
func (c *Coordinator) resumeRanks(ctx context.Context, byNode map[string][]agentv1.Rank) error {
	var wg sync.WaitGroup
	var emu sync.Mutex
	var errs []error
	for n, ranks := range byNode {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := c.client(ctx, n)
			if err == nil {
				err = cl.RankResume(ctx, agentv1.RankResume{Ranks: ranks})
			}
			if err != nil {
				emu.Lock()
				errs = append(errs, fmt.Errorf("resume on %s: %w", n, err))
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// teardownRanks removes j's rank containers on the live nodes of its
// placement, keeping the job networks. A rank that next is restored on
// the same node (next, the new placement, may be nil) keeps its
// container's dir, so that its output stays there as an earlier
// incarnation's.
func (c *Coordinator) teardownRanks(ctx context.Context, j *v1.Job, next []string) {
	live, _ := c.liveNodes(ctx)
	_ = c.forRanks(ctx, j, func(ctx context.Context, cl *rpc.AgentClient, r int) error {
		if _, ok := live[j.Placement[r]]; !ok {
			return nil
		}
		keep := r < len(next) && next[r] == j.Placement[r]
		return cl.RankRemove(ctx, agentv1.RankRemove{Rank: agentv1.Rank{Job: j.Name, Rank: r}, VNI: j.VNI, Addr: j.Addrs[r], Keep: keep})
	})
}

// recoverRestarts finishes the restarts an earlier coordinator left: a job
// still restarting (its ranks maybe restored and frozen, maybe not all)
// is restarted again from the same checkpoint, onto the same nodes if they
// are all alive. Its nodes may not have joined this coordinator yet, so a
// failed attempt is tried again a node lease later, five times.
func (c *Coordinator) recoverRestarts(ctx context.Context) {
	jobs, err := c.Jobs(ctx)
	if err != nil {
		c.log.Warn("recover restarts", "err", err)
		return
	}
	for _, j := range jobs {
		if j.State != v1.JobRestarting {
			continue
		}
		c.log.Info("finishing a restart an earlier coordinator left", "job", j.Name, "ckpt", j.RestartFrom, "placement", j.Placement)
		_ = c.retry(ctx, j.Name, "finishing a restart failed", func() error {
			req := v1.Restart{From: j.RestartFrom}
			if live, err := c.liveNodes(ctx); err == nil && allIn(j.Placement, live) {
				req.Placement = j.Placement
			}
			_, err := c.restart(ctx, j.Name, req, false)
			return err
		})
	}
}

// allIn tells whether every node of names is in live.
func allIn(names []string, live map[string]v1.Node) bool {
	for _, n := range names {
		if _, ok := live[n]; !ok {
			return false
		}
	}
	return len(names) > 0
}
