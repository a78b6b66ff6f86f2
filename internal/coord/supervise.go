package coord

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord/policy"
)

// supervisor is the one loop that decides what the coordinator does on
// its own (package coord/policy): it takes what happened (node losses,
// health, ended ranks, the outcomes of the protocols, the passing of
// time), a snapshot of the jobs and the nodes for each decision, and
// performs the actions the policy returns, each on its own. The protocols
// it and the API start report their outcomes to it (observe) and never
// start another protocol themselves.
type supervisor struct {
	c *Coordinator
	m *policy.Machine // only the loop touches it

	mu    sync.Mutex
	queue []policy.Event
	wake  chan struct{}
}

// tickEvery is how often periodic rounds and restart attempts are looked
// at.
const tickEvery = 250 * time.Millisecond

func newSupervisor(c *Coordinator) *supervisor {
	return &supervisor{c: c, m: policy.New(policy.Config{RetryAfter: c.opts.NodeTTL}), wake: make(chan struct{}, 1)}
}

// observe tells the supervisor what happened. It never blocks: an event
// waits in the queue until the loop takes it.
func (s *supervisor) observe(ev policy.Event) {
	s.mu.Lock()
	s.queue = append(s.queue, ev)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run is the loop, until ctx is done.
func (s *supervisor) run(ctx context.Context) {
	t := time.NewTicker(tickEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-t.C:
			s.decide(ctx, policy.Tick{})
		}
		for {
			s.mu.Lock()
			if len(s.queue) == 0 {
				s.mu.Unlock()
				break
			}
			ev := s.queue[0]
			s.queue = s.queue[1:]
			s.mu.Unlock()
			if !s.decide(ctx, ev) {
				// No snapshot (the catalog did not answer): the event
				// waits for the next tick.
				s.mu.Lock()
				s.queue = append([]policy.Event{ev}, s.queue...)
				s.mu.Unlock()
				break
			}
		}
	}
}

// decide steps the policy with ev on a fresh snapshot and performs what
// it returns. It reports false if it took no snapshot.
func (s *supervisor) decide(ctx context.Context, ev policy.Event) bool {
	snap, err := s.snapshot(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.c.log.Warn("no snapshot of the cluster for a decision; trying again", "event", ev.String(), "err", err)
		}
		return false
	}
	acts := s.m.Step(snap, ev)
	if _, tick := ev.(policy.Tick); !tick || len(acts) > 0 {
		s.c.log.Debug("supervisor", "event", ev.String(), "actions", fmt.Sprint(acts))
	}
	for _, a := range acts {
		s.c.background(func(ctx context.Context) { s.perform(ctx, a) })
	}
	return true
}

// snapshot reads what a decision is taken on: the jobs and the live
// nodes, once.
func (s *supervisor) snapshot(ctx context.Context) (policy.Snapshot, error) {
	snap := policy.Snapshot{Now: time.Now(), Live: map[string]bool{}}
	alive, err := s.c.cat.Alive(ctx)
	if err != nil {
		return snap, err
	}
	for n, ok := range alive {
		snap.Live[n] = ok
	}
	jobs, err := s.c.Jobs(ctx)
	if err != nil {
		return snap, err
	}
	for _, j := range jobs {
		snap.Jobs = append(snap.Jobs, policyJob(j))
	}
	return snap, nil
}

// policyJob is what the policy sees of a job.
func policyJob(j coordv1.Job) policy.Job {
	pj := policy.Job{Name: j.Name, Running: j.State == coordv1.JobRunning, Placement: j.Placement,
		MayRestart: mayRestart(&j), Every: j.CheckpointEvery, Auto: j.CheckpointAuto, Keep: j.Keep}
	if j.Tier != "" {
		pj.FlushEvery = j.FlushEvery
	}
	switch j.OnHealthWarning {
	case coordv1.HealthMigrate:
		pj.OnHealth = policy.HealthMigrate
	case coordv1.HealthCheckpoint:
		pj.OnHealth = policy.HealthCheckpoint
	}
	if j.CheckpointAuto {
		pj.Every, pj.NeedsInterval = 0, j.Interval == nil
		if j.Interval != nil {
			pj.Every = j.Interval.Every
		}
	}
	return pj
}

// mayRestart says whether a job's failure policy lets it restart once more.
func mayRestart(j *coordv1.Job) bool {
	return j.OnFailure != coordv1.OnFailureStop && (j.MaxRestarts <= 0 || j.Restarts < j.MaxRestarts)
}

// perform does one action of the policy, and tells the supervisor how it
// ended where the policy needs to know.
func (s *supervisor) perform(ctx context.Context, a policy.Action) {
	c := s.c
	switch a := a.(type) {
	case policy.Checkpoint:
		if a.Why != "" {
			c.log.Warn("checkpointing a job: "+a.Why, "job", a.Job)
		}
		if _, err := c.rounds.policyCheckpoint(ctx, a); err != nil && ctx.Err() == nil {
			c.log.Info("checkpoint", "job", a.Job, "periodic", a.Periodic, "result", err)
		}
		s.observe(policy.CheckpointEnded{Job: a.Job})
	case policy.Flush:
		if _, err := c.Flush(ctx, a.Job, coordv1.Flush{Seq: a.Seq}); err != nil && ctx.Err() == nil {
			c.log.Warn("flush to the durable tier", "job", a.Job, "ckpt", a.Seq, "err", err)
		}
	case policy.Retain:
		if err := c.keep.retain(ctx, a.Job); err != nil && ctx.Err() == nil {
			c.log.Warn("retention", "job", a.Job, "err", err)
		}
	case policy.Replicate:
		err := c.repl.replicate(ctx, a.Job, a.Seq)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.log.Warn("replication incomplete (tried again a node lease later, five attempts in all)", "job", a.Job, "ckpt", a.Seq, "err", err)
		}
		s.observe(policy.ReplicateEnded{Job: a.Job, Seq: a.Seq, Incomplete: err != nil})
	case policy.ReviewInterval:
		c.intervals.reviewInterval(ctx, a.Job)
		s.observe(policy.IntervalReviewed{Job: a.Job})
	case policy.Restart:
		err := s.restart(ctx, a)
		if ctx.Err() != nil {
			return // a coordinator that stops gives up nothing
		}
		ended := policy.RestartEnded{Job: a.Job, Cause: a.Cause, Attempt: a.Attempt}
		if err != nil {
			ended.Err = err.Error()
			c.log.Warn("automatic restart failed", "job", a.Job, "cause", a.Cause.String(), "attempt", a.Attempt, "err", err)
		}
		s.observe(ended)
	case policy.MarkLost:
		s.markLost(ctx, a.Job)
	case policy.MarkFailed:
		c.log.Warn("a rank of the job is damaged; not restarting it", "job", a.Job, "reason", a.Reason)
		unlock := c.locks.lock(a.Job)
		c.life.endJob(ctx, a.Job, coordv1.JobFailed, a.Reason)
		unlock()
	case policy.GiveUp:
		c.life.restartGaveUp(ctx, a.Job, a.Reason)
	case policy.Repair:
		c.repl.repair(ctx)
	case policy.MoveAway:
		for _, r := range a.Ranks {
			c.log.Warn("moving a rank off an unwell node", "job", a.Job, "rank", r, "node", a.Node)
			if _, err := c.Migrate(ctx, a.Job, coordv1.Migrate{Rank: r}); err != nil {
				c.log.Warn("migration off an unwell node failed", "job", a.Job, "rank", r, "err", err)
			}
		}
	case policy.Settle:
		if why := c.life.settle(ctx, a.Job); why != "" {
			s.observe(policy.RankEndedByNode{Job: a.Job, Reason: why})
		}
	}
}

// restart performs an automatic restart.
func (s *supervisor) restart(ctx context.Context, a policy.Restart) error {
	c := s.c
	switch a.Cause {
	case policy.CauseLost:
		if a.Attempt == 1 {
			c.log.Warn("job lost a node; restarting it", "job", a.Job)
		}
		_, err := c.runs.restart(ctx, a.Job, coordv1.Restart{}, restartIfLost)
		return err
	case policy.CauseDamaged:
		c.log.Warn("a rank of the job is damaged; restarting the job from its newest checkpoint", "job", a.Job)
		_, err := c.runs.restart(ctx, a.Job, coordv1.Restart{}, restartAsked)
		return err
	case policy.CauseRetry:
		c.log.Warn("a restart of the job failed; restarting it by its failure policy", "job", a.Job, "attempt", a.Attempt)
		_, err := c.runs.restart(ctx, a.Job, coordv1.Restart{}, restartRetry)
		return err
	}
	// One an earlier coordinator left: from the same checkpoint, onto the
	// same nodes if they are all alive.
	j, err := c.rec.job(ctx, a.Job)
	if err != nil {
		return err
	}
	if a.Attempt == 1 {
		c.log.Info("finishing a restart an earlier coordinator left", "job", j.Name, "ckpt", j.RestartFrom, "phase", j.RestartPhase, "placement", j.Placement)
	}
	req := coordv1.Restart{From: j.RestartFrom}
	if live, err := c.rec.liveNodes(ctx); err == nil && allIn(j.Placement, live) {
		req.Placement = j.Placement
	}
	_, err = c.runs.restart(ctx, j.Name, req, restartRecovered)
	return err
}

// markLost records that a running job lost a node and its policy does
// not let it restart.
func (s *supervisor) markLost(ctx context.Context, name string) {
	c := s.c
	defer c.locks.lock(name)()
	j, err := c.rec.updateJob(ctx, name, func(j *coordv1.Job) error {
		if j.State != coordv1.JobRunning {
			return errSettled
		}
		j.State, j.Reason = coordv1.JobLost, "a node of the job died"
		return nil
	})
	if err != nil {
		return
	}
	c.log.Warn("job lost a node; not restarting it", "job", name, "policy", j.OnFailure, "restarts", j.Restarts)
	c.publish(evv1.Event{Type: evv1.JobLost, Job: name, Message: fmt.Sprintf("policy %s, %d restarts", j.OnFailure, j.Restarts)})
}

// watchNodes tells the supervisor of nodes dying. After a coordinator
// takes over, agents need a moment to renew their leases; only then are
// nodes that stay dead dead.
func (s *supervisor) watchNodes(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(2 * s.c.opts.NodeTTL):
	}
	s.observe(policy.NodeLost{})
	for ev := range s.c.cat.WatchAlive(ctx) {
		if ev.Change == catalog.MemberLost {
			s.c.log.Warn("node lost", "node", ev.Name)
			s.c.publish(evv1.Event{Type: evv1.NodeLost, Node: ev.Name})
			s.observe(policy.NodeLost{Node: ev.Name})
		}
	}
}

// errSettled stops an update of a job that is no longer in a state it
// applies to.
var errSettled = errors.New("job settled otherwise")
