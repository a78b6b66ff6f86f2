package coord

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/coord/machine"
	"github.com/cairn-hpc/cairn/internal/coord/policy"
)

// restorable picks the checkpoint to restart from: number from, or the
// newest durable (or protected) one whose every rank image has a copy on a
// live node, or that is in durable tier tier ("" for none: a flush reads
// from nodes only).
func restorable(cks []coordv1.Ckpt, from int, live map[string]coordv1.Node, tier string) (*coordv1.Ckpt, error) {
	for i := len(cks) - 1; i >= 0; i-- {
		ck := &cks[i]
		if from != 0 && ck.Seq != from {
			continue
		}
		if ck.State != coordv1.CkptDurable && ck.State != coordv1.CkptProtected {
			if from != 0 {
				return nil, apiErr(coordv1.CodeNoCkpt, "checkpoint %s:%d is %s, not durable", ck.Job, ck.Seq, ck.State)
			}
			continue
		}
		var missing []string
		for _, r := range ck.Ranks {
			if len(liveCopies(r, live)) == 0 {
				missing = append(missing, fmt.Sprintf("rank %d (on %v)", r.Rank, copiesOf(r)))
			}
		}
		if len(missing) == 0 || inTier(ck, tier) {
			return ck, nil
		}
		if from != 0 {
			return nil, apiErr(coordv1.CodeNoCkpt, "checkpoint %s:%d cannot be restored: no live copy of %v", ck.Job, ck.Seq, missing)
		}
	}
	if from != 0 {
		return nil, apiErr(coordv1.CodeNoCkpt, "no checkpoint %d", from)
	}
	return nil, apiErr(coordv1.CodeNoCkpt, "no durable checkpoint with every rank image on a live node")
}

// inTier reports whether ck is flushed to durable tier tier.
func inTier(ck *coordv1.Ckpt, tier string) bool {
	return tier != "" && ck.Flushed != nil && ck.Flushed.URL == tier
}

// Restart restarts a whole job from a checkpoint: what is left of the job
// is removed; every target node fetches its ranks' images from the nodes
// that hold them and restores them frozen, with their network locked, all
// in parallel; once every rank is restored, all are resumed together
// (machine.Restart). Ranks keep their addresses wherever they land. A
// restart that fails (a node of the job died or was cut off during it)
// is tried again by the supervisor, from the newest restorable
// checkpoint, if the job's failure policy lets it restart.
func (c *Coordinator) Restart(ctx context.Context, name string, req coordv1.Restart) (*coordv1.Job, error) {
	if req.Tier != "" {
		return c.runs.restartFromTier(ctx, name, req)
	}
	return c.runs.restart(ctx, name, req, restartAsked)
}

// Why a restart runs.
type restartCause uint8

const (
	restartAsked     restartCause = iota // a user asked
	restartIfLost                        // a node died: only if a rank's node is dead (several nodes dying at once each ask; the first one restarts), or the job is failed (an earlier attempt failed)
	restartRecovered                     // an earlier coordinator died during it
	restartRetry                         // a user's restart failed: only if the job is failed, or lost a node
)

func (jr *jobRuns) restart(ctx context.Context, name string, req coordv1.Restart, cause restartCause) (*coordv1.Job, error) {
	c := jr.c
	defer c.locks.lock(name)()
	start := time.Now()
	j, err := c.rec.job(ctx, name)
	if err != nil {
		return nil, err
	}
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	// A job that lost a node restarts only if it still runs there (nodes
	// dying together each ask for it; the first restarts it). A job left
	// failed by a restart attempt restarts in any case: its placement is
	// that attempt's, whose nodes may well all be alive.
	if cause == restartIfLost && (j.State == coordv1.JobRunning && allIn(j.Placement, live) || j.State != coordv1.JobRunning && j.State != coordv1.JobFailed) {
		return j, nil
	}
	if cause == restartRecovered && j.State != coordv1.JobRestarting {
		return j, nil // finished meanwhile
	}
	if cause == restartRetry && j.State != coordv1.JobFailed && (j.State != coordv1.JobRunning || allIn(j.Placement, live)) {
		return j, nil // restarted meanwhile, or gone on otherwise
	}
	ck, cfg, err := jr.plan(ctx, j, req, cause, live)
	if err != nil {
		return nil, err
	}
	// What may be left of the job on nodes not alive now cannot be removed
	// now, but is not forgotten: a node whose lease lapsed (a missed
	// heartbeat, a cut) comes back with what it ran, a rank still attached
	// to its job network there. The record keeps those nodes, so that the
	// restart that finds one alive again removes the rank first.
	unreached := unreachedLeftover(j.Leftover, j.Placement, live)
	m, err := machine.NewRestart(cfg)
	if err != nil {
		return nil, err
	}
	log := c.log.With("job", name, "ckpt", ck.Seq)
	c.publish(evv1.Event{Type: evv1.JobRestarting, Job: name, Ckpt: ck.Seq, Message: "onto " + strings.Join(cfg.Placement, ",")})
	x, err := jr.newJobRun(ctx, j, log)
	if err != nil {
		return nil, err
	}
	x.ckpt, x.placement = ck.Seq, cfg.Placement
	x.persist = func(ctx context.Context, p machine.Persist) error {
		var err error
		switch p.Phase {
		case machine.PhaseRestoring:
			j, err = c.rec.updateJob(ctx, name, func(j *coordv1.Job) error {
				j.Placement, j.State, j.Reason = cfg.Placement, coordv1.JobRestarting, ""
				j.RestartFrom, j.RestartPhase, j.Leftover = ck.Seq, string(p.Phase), mergeLeftover(cfg.Leftover, unreached)
				return nil
			})
		case machine.PhaseResuming:
			j, err = c.rec.updateJob(ctx, name, func(j *coordv1.Job) error { j.RestartPhase = string(p.Phase); return nil })
		case machine.PhaseRunning:
			j, err = c.rec.updateJob(ctx, name, func(j *coordv1.Job) error {
				j.State, j.Restarts, j.RestoredFrom, j.StoppedAt = coordv1.JobRunning, j.Restarts+1, ck.Seq, 0
				j.RestartFrom, j.RestartPhase, j.Leftover = 0, "", unreached
				return nil
			})
			if err == nil {
				c.sup.observe(policy.Started{Job: name})
				log.Info("job restarted", "placement", cfg.Placement, "took", time.Since(start))
				c.publish(evv1.Event{Type: evv1.JobRestarted, Job: name, Ckpt: ck.Seq, Duration: time.Since(start), Message: "on " + strings.Join(cfg.Placement, ",")})
			}
		case machine.PhaseFailed:
			j, err = c.rec.updateJob(ctx, name, func(j *coordv1.Job) error {
				j.State, j.Reason = coordv1.JobFailed, p.Reason
				// What it could not remove (a node it could not reach)
				// may still run: the next restart stops it first, where
				// the job ran before as where this one restored.
				j.RestartFrom, j.RestartPhase, j.Leftover = 0, "", withPlacement(mergeLeftover(cfg.Leftover, unreached), cfg.Placement)
				return nil
			})
			c.publish(evv1.Event{Type: evv1.JobRestartFailed, Job: name, Ckpt: ck.Seq, Message: p.Reason})
			if err == nil && cause == restartAsked {
				// A node that died or was cut off during it leaves the
				// job to the supervisor (policy.CauseRetry); an
				// automatic restart reports to it already.
				c.sup.observe(policy.RestartEnded{Job: name, Cause: policy.CauseAsked, Err: p.Reason})
			}
		default:
			err = fmt.Errorf("restart: no phase %s", p.Phase)
		}
		return err
	}
	done, err := x.drive(ctx, m)
	if err == nil {
		err = doneErr(done)
	}
	if err != nil {
		return nil, fmt.Errorf("restart %s from checkpoint %d: %w", name, ck.Seq, err)
	}
	return j, nil
}

// restartPlacement picks the node of every rank of j for a restart from
// ck, whose live copies are copies (by rank): placement if the caller gave
// one; else a rank stays where it is if a copy of its image is there, else
// goes where its first live copy is (place: as long as the node has room
// under the job's ranks per node; the others go to the least loaded of
// cands, a spare first among equally loaded ones).
func restartPlacement(j *coordv1.Job, ck *coordv1.Ckpt, copies [][]string, cands []coordv1.Node, placement []string) ([]string, error) {
	if len(placement) > 0 {
		if len(placement) != len(ck.Ranks) {
			return nil, apiErr(agentv1.CodeBadRequest, "placement names %d nodes for %d ranks", len(placement), len(ck.Ranks))
		}
		return placement, nil
	}
	prefer := make([]string, len(ck.Ranks))
	for i := range ck.Ranks {
		if len(copies[i]) == 0 {
			continue // in the durable tier only
		}
		prefer[i] = copies[i][0]
		if i < len(j.Placement) && slices.Contains(copies[i], j.Placement[i]) {
			prefer[i] = j.Placement[i]
		}
	}
	// Each rank's current node is no longer loaded by it.
	cands = slices.Clone(cands)
	for i := range cands {
		for _, n := range j.Placement {
			if cands[i].Name == n && cands[i].Ranks > 0 {
				cands[i].Ranks--
			}
		}
	}
	return place(len(ck.Ranks), j.PerNode, cands, prefer)
}

// liveLeftover is, by rank, the live nodes among leftover and placement.
func liveLeftover(leftover [][]string, placement []string, live map[string]coordv1.Node) [][]string {
	out := withPlacement(leftover, placement)
	for r := range out {
		out[r] = slices.DeleteFunc(out[r], func(node string) bool { _, ok := live[node]; return !ok })
	}
	return out
}

// unreachedLeftover is, by rank, the nodes among leftover and placement
// that are not alive, or nil if there are none: what a restart cannot
// remove, for the job's record to keep.
func unreachedLeftover(leftover [][]string, placement []string, live map[string]coordv1.Node) [][]string {
	out := withPlacement(leftover, placement)
	some := false
	for r := range out {
		out[r] = slices.DeleteFunc(out[r], func(node string) bool { _, ok := live[node]; return ok })
		some = some || len(out[r]) > 0
	}
	if !some {
		return nil
	}
	return out
}

// mergeLeftover is, by rank, the nodes of a and of b, each once.
func mergeLeftover(a, b [][]string) [][]string {
	out := withPlacement(a, nil)
	for r := range b {
		if r >= len(out) {
			out = append(out, nil)
		}
		for _, node := range b[r] {
			if !slices.Contains(out[r], node) {
				out[r] = append(out[r], node)
			}
		}
	}
	return out
}

// withPlacement is, by rank, the nodes of leftover and the rank's node in
// placement, each once.
func withPlacement(leftover [][]string, placement []string) [][]string {
	n := max(len(leftover), len(placement))
	out := make([][]string, n)
	for r := range n {
		var nodes []string
		if r < len(leftover) {
			nodes = append(nodes, leftover[r]...)
		}
		if r < len(placement) {
			nodes = append(nodes, placement[r])
		}
		for _, node := range nodes {
			if node != "" && !slices.Contains(out[r], node) {
				out[r] = append(out[r], node)
			}
		}
	}
	return out
}

// nodesOf returns the distinct nodes of names, sorted, "" left out.
func nodesOf(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.DeleteFunc(slices.Compact(out), func(n string) bool { return n == "" })
}

// plan chooses what a restart of j restores and where: the checkpoint,
// the placement of its ranks (or, for one an earlier coordinator left
// with every rank restored, to resume them where they are), what may be
// left of the job, and the live nodes that must drop it.
func (jr *jobRuns) plan(ctx context.Context, j *coordv1.Job, req coordv1.Restart, cause restartCause, live map[string]coordv1.Node) (ck *coordv1.Ckpt, cfg machine.RestartConfig, err error) {
	c := jr.c
	cks, err := c.rec.ckpts(ctx, j.Name)
	if err != nil {
		return nil, cfg, err
	}
	ck, err = restorable(cks, req.From, live, j.Tier)
	if err != nil {
		return nil, cfg, err
	}
	cfg = machine.RestartConfig{Job: j.Name, Ckpt: ck.Seq, Lazy: j.LazyRestore, Tier: inTier(ck, j.Tier)}
	if req.Lazy != nil {
		cfg.Lazy = *req.Lazy
	}
	if jobMode(j) == coordv1.ModeApp {
		cfg.Lazy = false // its ranks start afresh on their files: no memory to fetch
	}
	for _, r := range ck.Ranks {
		cfg.Copies = append(cfg.Copies, liveCopies(r, live))
	}
	if cause == restartRecovered && machine.Phase(j.RestartPhase) == machine.PhaseResuming && j.RestartFrom == ck.Seq && allIn(j.Placement, live) {
		// Every rank was restored: resume them, if they are all there.
		cfg.Recover, cfg.Placement, cfg.Leftover = machine.PhaseResuming, j.Placement, liveLeftover(j.Leftover, nil, live)
	} else {
		cands, err := c.rec.candidates(ctx, req.Nodes, true) // restarts may use spares: that is what they are for
		if err != nil {
			return nil, cfg, err
		}
		// Only where the processes' CPU features are.
		if cands, err = withCPU(j, cands); err != nil {
			return nil, cfg, err
		}
		// Nodes found dead are seen so a lease after their last
		// heartbeat; a node that missed two already has most likely
		// failed too (failures come together), and a restart placed
		// there would fail and wait for the next attempt. Unless the
		// user named the nodes, or the others leave too little room.
		heard := cands
		if len(req.Nodes) == 0 {
			heard = c.nodes.heardWithin(cands, time.Now(), c.opts.NodeTTL/2)
		}
		cfg.Placement, err = restartPlacement(j, ck, cfg.Copies, heard, req.Placement)
		if err != nil && len(heard) < len(cands) {
			cfg.Placement, err = restartPlacement(j, ck, cfg.Copies, cands, req.Placement)
		}
		if err != nil {
			return nil, cfg, err
		}
		if len(req.Placement) > 0 {
			named, err := c.rec.candidates(ctx, req.Placement, true)
			if err != nil {
				return nil, cfg, err
			}
			if err := checkCPU(j, named, req.Placement); err != nil {
				return nil, cfg, err
			}
		}
		// What may be left of the job: where it ran, and where a restart
		// cut short restored it.
		cfg.Leftover = liveLeftover(j.Leftover, j.Placement, live)
	}
	for _, n := range nodesOf(append(slices.Clone(j.Placement), slices.Concat(cfg.Leftover...)...)) {
		if _, ok := live[n]; ok && !slices.Contains(cfg.Placement, n) {
			cfg.Drop = append(cfg.Drop, n)
		}
	}
	return ck, cfg, nil
}

// recoverRestarts hands the supervisor the restarts an earlier
// coordinator left: a job still restarting (its ranks maybe restored and
// frozen, maybe not all) is resumed if every rank was restored and is
// still there, else restarted again from the same checkpoint, onto the
// same nodes if they are all alive. Its nodes may not have joined this
// coordinator yet: the policy tries a failed attempt again a node lease
// later, five times.
func (jr *jobRuns) recoverRestarts(ctx context.Context) {
	c := jr.c
	jobs, err := c.Jobs(ctx)
	if err != nil {
		c.log.Warn("recover restarts", "err", err)
		return
	}
	for _, j := range jobs {
		if j.State == coordv1.JobRestarting {
			c.sup.observe(policy.Left{Job: j.Name})
		}
	}
}

// allIn tells whether every node of names is in live.
func allIn(names []string, live map[string]coordv1.Node) bool {
	for _, n := range names {
		if _, ok := live[n]; !ok {
			return false
		}
	}
	return len(names) > 0
}
