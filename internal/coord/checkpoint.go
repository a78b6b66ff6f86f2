package coord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord/policy"
	"github.com/cairn-hpc/cairn/internal/coord/round"
)

// Checkpoints lists a job's global checkpoints, oldest first; a durable or
// protected one says which of its ranks have no copy on a live node now
// (Unavailable), unless it is in the job's durable tier.
func (c *Coordinator) Checkpoints(ctx context.Context, job string) ([]coordv1.Ckpt, error) {
	j, err := c.rec.job(ctx, job)
	if err != nil {
		return nil, err
	}
	cks, err := c.rec.ckpts(ctx, job)
	if err != nil {
		return nil, err
	}
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	for i := range cks {
		if !inTier(&cks[i], j.Tier) {
			cks[i].Unavailable = unavailable(cks[i], live)
		}
	}
	return cks, nil
}

// unavailable lists the ranks of a durable or protected checkpoint that
// have no copy on a live node.
func unavailable(ck coordv1.Ckpt, live map[string]coordv1.Node) []int {
	if ck.State != coordv1.CkptDurable && ck.State != coordv1.CkptProtected {
		return nil
	}
	var out []int
	for _, r := range ck.Ranks {
		if len(liveCopies(r, live)) == 0 {
			out = append(out, r.Rank)
		}
	}
	return out
}

// Checkpoint takes a global checkpoint of a running job: one round of the
// two-phase commit. It returns when the round has ended, durable or
// aborted (then with an error of code aborted). With req.Stop, a round
// that commits ends every rank at the checkpoint instead of thawing it,
// and the job is stopped (stopRound).
func (c *Coordinator) Checkpoint(ctx context.Context, name string, req coordv1.CheckpointJob) (*coordv1.Ckpt, error) {
	defer c.locks.lock(name)()
	return c.rounds.checkpointLocked(ctx, coordv1.Ckpt{Job: name, Stop: req.Stop})
}

// rounds drives global checkpoints: each round of the two-phase commit
// (package round decides, roundRun performs), and the rounds an earlier
// coordinator left.
type rounds struct{ c *Coordinator }

// policyCheckpoint takes the round the supervisor's policy asked for. A
// periodic round is skipped, with an error of code conflict, while
// anything else runs on the job.
func (ro *rounds) policyCheckpoint(ctx context.Context, a policy.Checkpoint) (*coordv1.Ckpt, error) {
	if !a.Periodic {
		defer ro.c.locks.lock(a.Job)()
	} else if unlock, ok := ro.c.locks.tryLock(a.Job); ok {
		defer unlock()
	} else {
		return nil, apiErr(coordv1.CodeConflict, "job %s is busy", a.Job)
	}
	return ro.checkpointLocked(ctx, coordv1.Ckpt{Job: a.Job, Periodic: a.Periodic})
}

// checkpointLocked takes a round of the job that ck names, with the job's
// lock held; ck says what kind of round (Periodic, Stop), the rest of its
// record is made here.
func (ro *rounds) checkpointLocked(ctx context.Context, ck coordv1.Ckpt) (*coordv1.Ckpt, error) {
	c := ro.c
	name := ck.Job
	j, err := c.rec.job(ctx, name)
	if err != nil {
		return nil, err
	}
	if j.State != coordv1.JobRunning {
		return nil, apiErr(coordv1.CodeConflict, "job %s is %s: only a running job can be checkpointed", name, j.State)
	}
	seq := 0
	j, err = c.rec.updateJob(ctx, name, func(j *coordv1.Job) error {
		seq = j.NextCkpt
		j.NextCkpt++
		return nil
	})
	if err != nil {
		return nil, err
	}
	ck.Seq, ck.State, ck.Created = seq, coordv1.CkptPreparing, time.Now().UTC()
	for r, node := range j.Placement {
		ck.Ranks = append(ck.Ranks, coordv1.CkptRank{Rank: r, Node: node, State: round.RankPreparing.String()})
	}
	if err := c.cat.Create(ctx, ckptKey(name, seq), &ck); err != nil {
		return nil, err
	}
	c.sup.observe(policy.Started{Job: name})
	return ro.driveRound(ctx, &ck, nil)
}

// driveRound runs a round to its end (package round decides, roundRun
// performs) and records its outcome. recovered, if set, is the state the
// catalog holds for a round an earlier coordinator left unfinished.
func (ro *rounds) driveRound(ctx context.Context, ck *coordv1.Ckpt, recovered *round.State) (*coordv1.Ckpt, error) {
	c := ro.c
	cfg := round.Config{Job: ck.Job, Ckpt: uint64(ck.Seq), Deadline: time.Now().Add(c.opts.Deadline)}
	for _, r := range ck.Ranks {
		cfg.Participants = append(cfg.Participants, round.Participant{Rank: r.Rank, Node: r.Node})
	}
	var r *round.Round
	var err error
	if recovered == nil {
		r, err = round.New(cfg)
	} else {
		r, err = round.Recover(cfg, *recovered)
	}
	if err != nil {
		return nil, err
	}
	rr := &roundRun{c: c, ck: ck, log: c.log.With("job", ck.Job, "ckpt", ck.Seq), start: time.Now(), criu: map[int]time.Duration{}, memoryWait: map[int]time.Duration{}, newBytes: map[int]int64{}}
	if recovered != nil {
		rr.committed = ro.recoverStop(ctx, ck, *recovered)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	end, err := drive(wctx, machineRun[round.Event, round.Action]{
		step:    r.Step,
		kind:    roundActionKind,
		perform: rr.perform,
		tick:    round.Tick{},
		every:   100 * time.Millisecond,
		inputs:  ro.lostParticipants(wctx, cfg.Participants),
		log:     rr.log,
	}, round.Event(round.Start{}))
	if err != nil {
		return nil, err
	}
	done := end.(round.Done)
	final, err := rr.finish(context.WithoutCancel(ctx), done)
	rr.mu.Lock()
	damaged, committed := rr.damaged, rr.committed
	rr.mu.Unlock()
	if ck.Stop {
		err = ro.stopRound(context.WithoutCancel(ctx), ck, committed, err)
	}
	c.sup.observe(policy.RoundEnded{Job: ck.Job, Seq: ck.Seq, Periodic: ck.Periodic,
		Durable: err == nil && done.State == round.StateDurable, Damaged: damaged})
	return final, err
}

// roundActionKind says how the driver performs a round's action: the
// decision and the final state are written before anything else happens;
// aborts must reach their agents before the round ends (its ranks then
// run).
func roundActionKind(a round.Action) actionKind {
	switch a.(type) {
	case round.Done:
		return final
	case round.PersistDecision, round.PersistState:
		return inline
	case round.SendAbort:
		return awaited
	}
	return concurrent
}

// lostParticipants reports as Lost the participants whose node's lease
// expires, until ctx ends.
func (ro *rounds) lostParticipants(ctx context.Context, ps []round.Participant) <-chan round.Event {
	c := ro.c
	out := make(chan round.Event)
	go func() {
		for ev := range c.cat.WatchAlive(ctx) {
			if ev.Change != catalog.MemberLost {
				continue
			}
			for _, p := range ps {
				if p.Node != ev.Name {
					continue
				}
				select {
				case out <- round.Lost{Rank: p.Rank, Reason: "node " + p.Node + " lost"}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// roundRun performs the actions of one round.
type roundRun struct {
	c     *Coordinator
	ck    *coordv1.Ckpt
	log   *slog.Logger
	start time.Time

	mu   sync.Mutex
	criu map[int]time.Duration // each rank's dump by CRIU, as its agent measured it
	// memoryWait is each rank's wait for its lazily restored memory
	// before its dump.
	memoryWait map[int]time.Duration
	newBytes   map[int]int64 // each rank's bytes its node's store lacked
	damaged    string        // why a dump left a rank unusable, if one did
	committed  bool          // the decision to commit is in the catalog
}

func (rr *roundRun) finishReq(rank int) agentv1.Finish {
	return agentv1.Finish{Rank: agentv1.Rank{Job: rr.ck.Job, Rank: rank}, Seq: rr.ck.Seq}
}

func (rr *roundRun) perform(ctx context.Context, a round.Action) (round.Event, bool) {
	rr.log.Debug("round", "action", a.String())
	c, ck := rr.c, rr.ck
	switch a := a.(type) {
	case round.SendPrepare:
		cl, err := c.agents.client(ctx, a.Node)
		if err != nil {
			return round.Lost{Rank: a.Rank, Reason: err.Error()}, true
		}
		pctx, cancel := context.WithTimeout(ctx, c.opts.Deadline)
		defer cancel()
		out, err := cl.Prepare(pctx, agentv1.Prepare{Rank: agentv1.Rank{Job: ck.Job, Rank: a.Rank}, Seq: ck.Seq, Hold: c.opts.Hold, MemoryWait: c.migs.memoryWait()})
		if err != nil {
			if isDamaged(err) {
				rr.mu.Lock()
				rr.damaged = err.Error()
				rr.mu.Unlock()
			}
			return agentEvent(a.Rank, err), true
		}
		rr.mu.Lock()
		rr.criu[a.Rank], rr.memoryWait[a.Rank] = out.CRIU, out.MemoryWait
		rr.mu.Unlock()
		return round.Prepared{Rank: a.Rank, ImageSize: out.Size, Dump: out.Dump}, true
	case round.SendCommit:
		cl, err := c.agents.client(ctx, a.Node)
		var out agentv1.Committed
		if err == nil {
			req := rr.finishReq(a.Rank)
			req.Stop = ck.Stop
			out, err = cl.Commit(ctx, req)
		}
		if err != nil {
			return agentEvent(a.Rank, err), true
		}
		rr.mu.Lock()
		rr.newBytes[a.Rank] = out.NewBytes
		rr.mu.Unlock()
		return round.Durable{Rank: a.Rank}, true
	case round.SendAbort:
		cl, err := c.agents.client(ctx, a.Node)
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = cl.Abort(actx, rr.finishReq(a.Rank))
			cancel()
		}
		if err != nil {
			rr.log.Warn("abort not delivered; the agent drops the rank's prepare by itself", "rank", a.Rank, "node", a.Node, "err", err)
		}
		return nil, false
	case round.PersistDecision:
		if a.State == round.StateCommitted {
			c.publish(evv1.Event{Type: evv1.CkptPrepared, Job: ck.Job, Ckpt: ck.Seq, Duration: time.Since(rr.start),
				Message: fmt.Sprintf("%d ranks dumped", len(ck.Ranks))})
		}
		c.trace(ck.Job, a.String())
		c.hold(ctx, "before-decision")
		for {
			err := c.rounds.setCkptState(ctx, ck, a.State, a.Reason, true)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil, false
			}
			rr.log.Warn("persist decision", "err", err)
			time.Sleep(200 * time.Millisecond)
		}
		typ := evv1.CkptCommitted
		if a.State != round.StateCommitted {
			typ = evv1.CkptAborted
		}
		c.publish(evv1.Event{Type: typ, Job: ck.Job, Ckpt: ck.Seq, Duration: time.Since(rr.start), Message: a.Reason})
		if a.State == round.StateCommitted {
			rr.mu.Lock()
			rr.committed = true
			rr.mu.Unlock()
			if ck.Stop {
				c.rounds.markStopping(ctx, ck)
			}
		}
		c.hold(ctx, "after-decision")
		return round.DecisionPersisted{}, true
	case round.PersistState:
		c.trace(ck.Job, a.String())
		if err := c.rounds.setCkptState(ctx, ck, a.State, a.Reason, false); err != nil {
			rr.log.Warn("persist round state", "err", err)
		}
	}
	return nil, false
}

// markStopping records, once a stop round's commit is decided and before
// any agent hears of it, that the job is stopped at that checkpoint: from
// then on nothing takes its ranks ending for the job's end, and a
// coordinator that dies now finds the job stopped. It retries until the
// record is written or ctx ends.
func (ro *rounds) markStopping(ctx context.Context, ck *coordv1.Ckpt) {
	c := ro.c
	for {
		_, err := c.rec.updateJob(ctx, ck.Job, func(j *coordv1.Job) error {
			j.State, j.Reason, j.StoppedAt = coordv1.JobStopped, fmt.Sprintf("stopping at checkpoint %d", ck.Seq), ck.Seq
			return nil
		})
		if err == nil || ctx.Err() != nil || hasCode(err, agentv1.CodeNotFound) {
			return
		}
		c.log.Warn("record the job stopping", "job", ck.Job, "ckpt", ck.Seq, "err", err)
		time.Sleep(200 * time.Millisecond)
	}
}

// recoverStop says whether a round an earlier coordinator left, found in
// state s, was decided commit, and readies a stop round for its recovery:
// a committed one marks the job stopped (again) before it commits again
// with Stop. A stop round whose commit was decided can also be found
// aborted (a commit failed, or did not reach its agent before the
// coordinator died): the job, stopped at it, says so. Its aborts would
// thaw the ranks still prepared, so whatever of the job runs is killed
// first.
func (ro *rounds) recoverStop(ctx context.Context, ck *coordv1.Ckpt, s round.State) (committed bool) {
	c := ro.c
	switch {
	case s == round.StateCommitted:
		if ck.Stop {
			ro.markStopping(ctx, ck)
		}
		return true
	case s == round.StateAborted && ck.Stop:
		j, err := c.rec.job(ctx, ck.Job)
		if err != nil || j.State != coordv1.JobStopped || j.StoppedAt != ck.Seq {
			return false
		}
		if err := c.runs.signalRanks(ctx, j, syscall.SIGKILL); err != nil {
			c.log.Warn("kill what is left of a stopped job", "job", ck.Job, "err", err)
		}
		return true
	}
	return false
}

// stopRound ends a stop round whose outcome err is: a round that aborted
// before its decision stopped nothing, and the job runs on; one that
// committed stopped the job at its checkpoint, whether or not every image
// became durable. What of the job may still run (a rank whose commit did
// not reach its agent) is killed, and the job's reason says where
// cairn restart resumes it.
func (ro *rounds) stopRound(ctx context.Context, ck *coordv1.Ckpt, committed bool, err error) error {
	c := ro.c
	if !committed {
		if err != nil {
			return fmt.Errorf("%w; the job was not stopped and runs on", err)
		}
		return err
	}
	reason := fmt.Sprintf("stopped at checkpoint %d", ck.Seq)
	if err != nil {
		reason = fmt.Sprintf("stopped at checkpoint %d, which is not durable on every rank (%v): cairn restart resumes it from the newest complete checkpoint", ck.Seq, err)
	}
	j, jerr := c.rec.updateJob(ctx, ck.Job, func(j *coordv1.Job) error {
		j.State, j.Reason = coordv1.JobStopped, reason
		return nil
	})
	if jerr != nil {
		return errors.Join(err, fmt.Errorf("the job is stopped, but that could not be recorded: %w", jerr))
	}
	if kerr := c.runs.signalRanks(ctx, j, syscall.SIGKILL); kerr != nil {
		c.log.Warn("kill what is left of a stopped job", "job", ck.Job, "err", kerr)
	}
	c.log.Info("job stopped", "job", ck.Job, "ckpt", ck.Seq, "reason", reason)
	c.publish(evv1.Event{Type: evv1.JobStopped, Job: ck.Job, Ckpt: ck.Seq, Message: reason})
	if err != nil {
		return fmt.Errorf("%w; the job is stopped: cairn restart resumes it from the newest complete checkpoint", err)
	}
	return nil
}

// agentEvent turns an agent's error into Failed (the agent answered) or
// Lost (it did not).
func agentEvent(rank int, err error) round.Event {
	var we *agentv1.Error
	if errors.As(err, &we) {
		return round.Failed{Rank: rank, Reason: err.Error()}
	}
	return round.Lost{Rank: rank, Reason: err.Error()}
}

// finish records the outcome of the round with its statistics.
func (rr *roundRun) finish(ctx context.Context, done round.Done) (*coordv1.Ckpt, error) {
	c, ck := rr.c, rr.ck
	var final coordv1.Ckpt
	err := c.cat.Update(ctx, ckptKey(ck.Job, ck.Seq), &final, func() error {
		st := done.Stats
		final.Finished = time.Now().UTC()
		final.Stall, final.Coord, final.MaxDump, final.Persist, final.Ingest, final.Bytes = st.Stall, st.Coord, st.MaxDump, st.Persist, st.Ingest, st.Bytes
		rr.mu.Lock()
		defer rr.mu.Unlock()
		var slowest round.RankStats
		for i, rs := range st.Ranks {
			if i < len(final.Ranks) {
				final.Ranks[i].State, final.Ranks[i].Reason = rs.State.String(), rs.Reason
				final.Ranks[i].Size, final.Ranks[i].Dump, final.Ranks[i].CRIU = rs.Size, rs.Dump, rr.criu[rs.Rank]
				final.Ranks[i].MemoryWait = rr.memoryWait[rs.Rank]
				final.Ranks[i].Ingest, final.Ranks[i].NewBytes = rs.Durable, rr.newBytes[rs.Rank]
				if rs.State == round.RankDurable {
					final.Ranks[i].Copies = []string{rs.Node}
				}
			}
			if rs.Dump > slowest.Dump {
				slowest = rs
			}
		}
		if c, ok := rr.criu[slowest.Rank]; ok && slowest.Dump > c {
			final.Cont = slowest.Dump - c
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rr.log.Info("round ended", "state", done.State.String(), "reason", done.Reason, "stall", done.Stats.Stall, "coord", done.Stats.Coord, "bytes", done.Stats.Bytes)
	if done.State != round.StateDurable {
		return &final, apiErr(coordv1.CodeAborted, "checkpoint %s:%d aborted: %s", ck.Job, ck.Seq, done.Reason)
	}
	c.publish(evv1.Event{Type: evv1.CkptDurable, Job: ck.Job, Ckpt: ck.Seq, Duration: done.Stats.Stall, Bytes: done.Stats.Bytes,
		Message: fmt.Sprintf("ranks frozen %s, coordination %s", done.Stats.Stall.Round(time.Millisecond), done.Stats.Coord.Round(time.Millisecond))})
	_, err = c.rec.updateJob(ctx, ck.Job, func(j *coordv1.Job) error {
		if ck.Seq > j.LastCkpt {
			j.LastCkpt = ck.Seq
		}
		return nil
	})
	if err != nil {
		rr.log.Warn("record the job's last checkpoint", "err", err)
	}
	return &final, nil
}

// setCkptState moves a checkpoint record to state s. A decision moves it
// only from preparing, in one compare-and-swap: the commit point.
func (ro *rounds) setCkptState(ctx context.Context, ck *coordv1.Ckpt, s round.State, reason string, decision bool) error {
	c := ro.c
	var cur coordv1.Ckpt
	return c.cat.Update(ctx, ckptKey(ck.Job, ck.Seq), &cur, func() error {
		if decision && cur.State != coordv1.CkptPreparing {
			return fmt.Errorf("checkpoint %s:%d is %s, not preparing", ck.Job, ck.Seq, cur.State)
		}
		cur.State, cur.Reason = ckptState(s), reason
		if decision {
			cur.Decided = time.Now().UTC()
		}
		return nil
	})
}

// recoverRounds finishes the rounds an earlier coordinator left: preparing
// ones abort, committed ones are committed again until durable, aborted
// ones have their aborts sent again.
func (ro *rounds) recoverRounds(ctx context.Context) {
	c := ro.c
	jobs, err := c.Jobs(ctx)
	if err != nil {
		c.log.Warn("recover rounds", "err", err)
		return
	}
	for _, j := range jobs {
		cks, err := c.rec.ckpts(ctx, j.Name)
		if err != nil {
			c.log.Warn("recover rounds", "job", j.Name, "err", err)
			continue
		}
		for _, ck := range cks {
			var s round.State
			switch {
			case ck.State == coordv1.CkptPreparing:
				s = round.StatePreparing
			case ck.State == coordv1.CkptCommitted:
				s = round.StateCommitted
			case ck.State == coordv1.CkptDurable:
				// Durable but maybe not yet replicated when the last
				// coordinator stopped.
				c.sup.observe(policy.Left{Job: j.Name, Seq: ck.Seq})
				continue
			case ck.State == coordv1.CkptAborted && ck.Finished.IsZero():
				s = round.StateAborted
			default:
				continue
			}
			c.log.Info("recovering an unfinished round", "job", j.Name, "ckpt", ck.Seq, "state", ck.State)
			unlock := c.locks.lock(j.Name)
			_, err := ro.driveRound(ctx, &ck, &s)
			unlock()
			if err != nil {
				c.log.Info("recovered round", "job", j.Name, "ckpt", ck.Seq, "result", err)
			}
		}
	}
}

// ckptState is the record's state for a round's.
func ckptState(s round.State) coordv1.CkptState {
	switch s {
	case round.StatePreparing:
		return coordv1.CkptPreparing
	case round.StateCommitted:
		return coordv1.CkptCommitted
	case round.StateDurable:
		return coordv1.CkptDurable
	}
	return coordv1.CkptAborted
}
