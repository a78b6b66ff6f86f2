package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	agentv1 "cairn/api/agent/v1"
	v1 "cairn/api/coord/v1"
	evv1 "cairn/api/events/v1"
	"cairn/internal/catalog"
	"cairn/internal/coord/round"
	"cairn/internal/failpoint"
)

// Checkpoints lists a job's global checkpoints, oldest first.
func (c *Coordinator) Checkpoints(ctx context.Context, job string) ([]v1.Ckpt, error) {
	if _, err := c.job(ctx, job); err != nil {
		return nil, err
	}
	return c.ckpts(ctx, job)
}

func (c *Coordinator) ckpts(ctx context.Context, job string) ([]v1.Ckpt, error) {
	return listBySeq(ctx, c, ckptPrefix(job), func(ck v1.Ckpt) int { return ck.Seq })
}

// listBySeq reads the records under prefix, ordered by their number.
func listBySeq[T any](ctx context.Context, c *Coordinator, prefix string, seq func(T) int) ([]T, error) {
	var out []T
	_, err := c.cat.List(ctx, prefix, func(_ string, raw []byte) error {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return err
		}
		out = append(out, v)
		return nil
	})
	sort.Slice(out, func(a, b int) bool { return seq(out[a]) < seq(out[b]) })
	return out, err
}

// Checkpoint takes a global checkpoint of a running job: one round of the
// two-phase commit. It returns when the round has ended, durable or
// aborted (then with an error of code aborted). A periodic round is
// skipped, with an error of code conflict, while anything else runs on
// the job.
func (c *Coordinator) Checkpoint(ctx context.Context, name string, periodic bool) (*v1.Ckpt, error) {
	if !periodic {
		defer c.lockJob(name)()
	} else if unlock, ok := c.tryLockJob(name); ok {
		defer unlock()
	} else {
		return nil, apiErr(v1.CodeConflict, "job %s is busy", name)
	}
	j, err := c.job(ctx, name)
	if err != nil {
		return nil, err
	}
	if j.State != v1.JobRunning {
		return nil, apiErr(v1.CodeConflict, "job %s is %s: only a running job can be checkpointed", name, j.State)
	}
	seq := 0
	j, err = c.updateJob(ctx, name, func(j *v1.Job) error {
		seq = j.NextCkpt
		j.NextCkpt++
		return nil
	})
	if err != nil {
		return nil, err
	}
	ck := &v1.Ckpt{Job: name, Seq: seq, State: v1.CkptPreparing, Created: time.Now().UTC(), Periodic: periodic}
	for r, node := range j.Placement {
		ck.Ranks = append(ck.Ranks, v1.CkptRank{Rank: r, Node: node, State: "preparing"})
	}
	if err := c.cat.Create(ctx, ckptKey(name, seq), ck); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.lastRun[name] = time.Now()
	c.mu.Unlock()
	return c.drive(ctx, ck, nil)
}

// drive runs a round to its end: it performs the round's actions and steps
// back what comes of them. recovered, if set, is the state the catalog
// holds for a round an earlier coordinator left unfinished.
func (c *Coordinator) drive(ctx context.Context, ck *v1.Ckpt, recovered *round.State) (*v1.Ckpt, error) {
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
	log := c.log.With("job", ck.Job, "ckpt", ck.Seq)
	start := time.Now()
	events := make(chan round.Event, 4*len(cfg.Participants)+4)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	send := func(ev round.Event) {
		select {
		case events <- ev:
		case <-wctx.Done():
		}
	}
	// A node that dies takes its ranks out of the round.
	go func() {
		for ev := range c.cat.WatchAlive(wctx) {
			if ev.Change != catalog.MemberLost {
				continue
			}
			for _, p := range cfg.Participants {
				if p.Node == ev.Name {
					send(round.Lost{Rank: p.Rank, Reason: "node " + p.Node + " lost"})
				}
			}
		}
	}()
	// rpcEvent turns an agent's error into Failed (the agent answered) or
	// Lost (it did not).
	rpcEvent := func(rank int, err error) round.Event {
		var we *agentv1.Error
		if errors.As(err, &we) {
			return round.Failed{Rank: rank, Reason: err.Error()}
		}
		return round.Lost{Rank: rank, Reason: err.Error()}
	}
	var criuMu sync.Mutex
	criuTime := map[int]time.Duration{}
	var aborts sync.WaitGroup // a round ends once its aborts are delivered: its ranks then run
	var done *round.Done
	var queue []round.Event
	perform := func(acts []round.Action) {
		for _, a := range acts {
			log.Debug("round", "action", a.String())
			switch a := a.(type) {
			case round.SendPrepare:
				go func() {
					cl, err := c.client(wctx, a.Node)
					if err != nil {
						send(round.Lost{Rank: a.Rank, Reason: err.Error()})
						return
					}
					rctx, rcancel := context.WithTimeout(wctx, c.opts.Deadline)
					defer rcancel()
					out, err := cl.Prepare(rctx, agentv1.Prepare{Rank: agentv1.Rank{Job: ck.Job, Rank: a.Rank}, Seq: ck.Seq, Hold: c.opts.Hold})
					if err != nil {
						if isDamaged(err) {
							c.rankDamaged(ck.Job, err.Error())
						}
						send(rpcEvent(a.Rank, err))
						return
					}
					criuMu.Lock()
					criuTime[a.Rank] = out.CRIU
					criuMu.Unlock()
					send(round.Prepared{Rank: a.Rank, ImageSize: out.Size, Dump: out.Dump})
				}()
			case round.SendCommit:
				go func() {
					cl, err := c.client(wctx, a.Node)
					if err != nil {
						send(round.Lost{Rank: a.Rank, Reason: err.Error()})
						return
					}
					out, err := cl.Commit(wctx, agentv1.Finish{Rank: agentv1.Rank{Job: ck.Job, Rank: a.Rank}, Seq: ck.Seq})
					if err != nil {
						send(rpcEvent(a.Rank, err))
						return
					}
					_ = out
					send(round.Durable{Rank: a.Rank})
				}()
			case round.SendAbort:
				aborts.Add(1)
				go func() {
					defer aborts.Done()
					cl, err := c.client(wctx, a.Node)
					if err == nil {
						actx, acancel := context.WithTimeout(wctx, 30*time.Second)
						err = cl.Abort(actx, agentv1.Finish{Rank: agentv1.Rank{Job: ck.Job, Rank: a.Rank}, Seq: ck.Seq})
						acancel()
					}
					if err != nil {
						log.Warn("abort not delivered; the agent drops the rank's prepare by itself", "rank", a.Rank, "node", a.Node, "err", err)
					}
				}()
			case round.PersistDecision:
				if a.State == round.StateCommitted {
					c.publish(evv1.Event{Type: evv1.CkptPrepared, Job: ck.Job, Ckpt: ck.Seq, Duration: time.Since(start),
						Message: fmt.Sprintf("%d ranks dumped", len(cfg.Participants))})
				}
				failpoint.Hold(wctx, "before-decision", c.log)
				for {
					err := c.setCkptState(wctx, ck, a.State, a.Reason, true)
					if err == nil {
						break
					}
					if wctx.Err() != nil {
						return
					}
					log.Warn("persist decision", "err", err)
					time.Sleep(200 * time.Millisecond)
				}
				if a.State == round.StateCommitted {
					c.publish(evv1.Event{Type: evv1.CkptCommitted, Job: ck.Job, Ckpt: ck.Seq, Duration: time.Since(start)})
				} else {
					c.publish(evv1.Event{Type: evv1.CkptAborted, Job: ck.Job, Ckpt: ck.Seq, Duration: time.Since(start), Message: a.Reason})
				}
				failpoint.Hold(wctx, "after-decision", c.log)
				queue = append(queue, round.DecisionPersisted{})
			case round.PersistState:
				if err := c.setCkptState(wctx, ck, a.State, a.Reason, false); err != nil {
					log.Warn("persist round state", "err", err)
				}
			case round.Done:
				done = &a
			}
		}
	}
	step := func(ev round.Event) {
		acts, err := r.Step(time.Now(), ev)
		if err != nil {
			log.Debug("round ignored an event", "err", err)
		}
		perform(acts)
		for len(queue) > 0 {
			ev := queue[0]
			queue = queue[1:]
			acts, err := r.Step(time.Now(), ev)
			if err != nil {
				log.Debug("round ignored an event", "err", err)
			}
			perform(acts)
		}
	}
	step(round.Start{})
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for done == nil {
		select {
		case ev := <-events:
			step(ev)
		case <-tick.C:
			step(round.Tick{})
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	aborts.Wait()
	// Record the outcome with the round's statistics.
	var final v1.Ckpt
	err = c.cat.Update(context.WithoutCancel(ctx), ckptKey(ck.Job, ck.Seq), &final, func() error {
		st := done.Stats
		final.Finished = time.Now().UTC()
		final.Stall, final.Coord, final.MaxDump, final.Persist, final.Ingest, final.Bytes = st.Stall, st.Coord, st.MaxDump, st.Persist, st.Ingest, st.Bytes
		criuMu.Lock()
		defer criuMu.Unlock()
		var slowest round.RankStats
		for i, rs := range st.Ranks {
			if i < len(final.Ranks) {
				final.Ranks[i].State, final.Ranks[i].Reason = rs.State.String(), rs.Reason
				final.Ranks[i].Size, final.Ranks[i].Dump, final.Ranks[i].CRIU = rs.Size, rs.Dump, criuTime[rs.Rank]
				if rs.State == round.RankDurable {
					final.Ranks[i].Copies = []string{rs.Node}
				}
			}
			if rs.Dump > slowest.Dump {
				slowest = rs
			}
		}
		if c, ok := criuTime[slowest.Rank]; ok && slowest.Dump > c {
			final.Cont = slowest.Dump - c
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	log.Info("round ended", "state", done.State.String(), "reason", done.Reason, "stall", done.Stats.Stall, "coord", done.Stats.Coord, "bytes", done.Stats.Bytes)
	if done.State == round.StateDurable {
		c.publish(evv1.Event{Type: evv1.CkptDurable, Job: ck.Job, Ckpt: ck.Seq, Duration: done.Stats.Stall, Bytes: done.Stats.Bytes,
			Message: fmt.Sprintf("ranks frozen %s, coordination %s", done.Stats.Stall.Round(time.Millisecond), done.Stats.Coord.Round(time.Millisecond))})
		_, _ = c.updateJob(context.WithoutCancel(ctx), ck.Job, func(j *v1.Job) error {
			if ck.Seq > j.LastCkpt {
				j.LastCkpt = ck.Seq
			}
			return nil
		})
		c.replicateLater(context.WithoutCancel(ctx), ck.Job, ck.Seq)
		return &final, nil
	}
	return &final, apiErr(v1.CodeAborted, "checkpoint %s:%d aborted: %s", ck.Job, ck.Seq, done.Reason)
}

// setCkptState moves a checkpoint record to state s. A decision moves it
// only from preparing, in one compare-and-swap: the commit point.
func (c *Coordinator) setCkptState(ctx context.Context, ck *v1.Ckpt, s round.State, reason string, decision bool) error {
	var cur v1.Ckpt
	return c.cat.Update(ctx, ckptKey(ck.Job, ck.Seq), &cur, func() error {
		if decision && cur.State != v1.CkptPreparing {
			return fmt.Errorf("checkpoint %s:%d is %s, not preparing", ck.Job, ck.Seq, cur.State)
		}
		cur.State, cur.Reason = s.String(), reason
		if decision {
			cur.Decided = time.Now().UTC()
		}
		return nil
	})
}

// recoverRounds finishes the rounds an earlier coordinator left: preparing
// ones abort, committed ones are committed again until durable, aborted
// ones have their aborts sent again.
func (c *Coordinator) recoverRounds(ctx context.Context) {
	jobs, err := c.Jobs(ctx)
	if err != nil {
		c.log.Warn("recover rounds", "err", err)
		return
	}
	for _, j := range jobs {
		cks, err := c.ckpts(ctx, j.Name)
		if err != nil {
			c.log.Warn("recover rounds", "job", j.Name, "err", err)
			continue
		}
		for _, ck := range cks {
			var s round.State
			switch {
			case ck.State == v1.CkptPreparing:
				s = round.StatePreparing
			case ck.State == v1.CkptCommitted:
				s = round.StateCommitted
			case ck.State == v1.CkptDurable:
				// Durable but maybe not yet replicated when the last
				// coordinator stopped.
				c.replicateLater(ctx, j.Name, ck.Seq)
				continue
			case ck.State == v1.CkptAborted && ck.Finished.IsZero():
				s = round.StateAborted
			default:
				continue
			}
			c.log.Info("recovering an unfinished round", "job", j.Name, "ckpt", ck.Seq, "state", ck.State)
			unlock := c.lockJob(j.Name)
			_, err := c.drive(ctx, &ck, &s)
			unlock()
			if err != nil {
				c.log.Info("recovered round", "job", j.Name, "ckpt", ck.Seq, "result", err)
			}
		}
	}
}

// periodic starts the rounds of jobs with a checkpoint interval. A round
// never overlaps another one of its job: a round that is due while one
// still runs waits for the next tick.
func (c *Coordinator) periodic(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		jobs, err := c.Jobs(ctx)
		if err != nil {
			continue
		}
		for _, j := range jobs {
			if j.CheckpointEvery <= 0 || j.State != v1.JobRunning {
				continue
			}
			c.mu.Lock()
			last, ok := c.lastRun[j.Name]
			if !ok {
				last = time.Now()
				c.lastRun[j.Name] = last
			}
			c.mu.Unlock()
			if time.Since(last) < j.CheckpointEvery {
				continue
			}
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				if _, err := c.Checkpoint(ctx, j.Name, true); err != nil {
					c.log.Info("periodic checkpoint", "job", j.Name, "result", err)
					c.noteExited(ctx, j.Name)
				}
			}()
		}
	}
}

// noteExited marks a running job exited once every rank has exited, so
// that its periodic rounds stop.
func (c *Coordinator) noteExited(ctx context.Context, name string) {
	st, err := c.Status(ctx, name)
	if err != nil || st.State != v1.JobRunning {
		return
	}
	for _, r := range st.RankStates {
		// Only ranks seen to exit: a rank on a dead node is for the
		// failure handling, not an end.
		if r.Status != "exited" || !r.Alive {
			return
		}
	}
	unlock, ok := c.tryLockJob(name)
	if !ok {
		return // something else runs on the job: the next round looks again
	}
	defer unlock()
	_, err = c.updateJob(ctx, name, func(j *v1.Job) error {
		if j.State == v1.JobRunning {
			j.State = v1.JobExited
		}
		return nil
	})
	if err == nil {
		c.log.Info("every rank of the job has exited; no more periodic checkpoints", "job", name, "failed", st.Failed)
	}
}
