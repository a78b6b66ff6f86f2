package coord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord/machine"
	"github.com/cairn-hpc/cairn/internal/coord/policy"
	"github.com/cairn-hpc/cairn/internal/cpufeat"
)

func migPrefix(job string) string       { return "migrations/" + job + "/" }
func migKey(job string, seq int) string { return fmt.Sprintf("migrations/%s/%08d", job, seq) }

// migrations drives live migrations of ranks (machine.Migration), and
// those an earlier coordinator left.
type migrations struct{ c *Coordinator }

// migrationHold is how long agents keep ranks stalled for a migration
// before they give up on the coordinator.
func (mg *migrations) migrationHold() time.Duration { return mg.c.opts.Hold + time.Minute }

// memoryWait is how long an agent may wait for the memory of a lazily
// restored rank before it dumps it (agentv1.Prepare.MemoryWait): within
// the prepare deadline, so that a rank whose memory does not arrive in
// time fails the round for that reason rather than by the deadline.
func (mg *migrations) memoryWait() time.Duration { return mg.c.opts.Deadline * 3 / 4 }

// Migrate moves one rank of a running job to another node while the rest
// of the job waits (machine.Migration): the others are stalled and the
// rank dumped on its node; the target pulls the staged image straight
// from the source's staging (no copy on either disk first) and restores
// it, frozen; the job's record then places the rank on the target (the
// commit point), the source's copy goes, every node's job network points
// at the rank's new node, and every rank resumes. Any failure before the
// commit point undoes the migration: every rank, the moving one included,
// runs again where it was. to may be empty: a spare, else the least
// loaded node.
func (c *Coordinator) Migrate(ctx context.Context, name string, req coordv1.Migrate) (*coordv1.Migration, error) {
	defer c.locks.lock(name)()
	return c.migs.migrate(ctx, name, req)
}

func (mg *migrations) migrate(ctx context.Context, name string, req coordv1.Migrate) (*coordv1.Migration, error) {
	c := mg.c
	rank, to := req.Rank, req.To
	j, err := c.rec.job(ctx, name)
	if err != nil {
		return nil, err
	}
	if j.State != coordv1.JobRunning {
		return nil, apiErr(coordv1.CodeConflict, "job %s is %s: only a running job's ranks can migrate", name, j.State)
	}
	if rank < 0 || rank >= len(j.Placement) {
		return nil, apiErr(agentv1.CodeBadRequest, "job %s has no rank %d", name, rank)
	}
	from := j.Placement[rank]
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range j.Placement {
		if _, ok := live[n]; !ok {
			return nil, apiErr(coordv1.CodeNodeDead, "node %s of job %s is dead: restart the job instead", n, name)
		}
	}
	if to == "" {
		if to, err = mg.migrationTarget(ctx, j, from); err != nil {
			return nil, err
		}
	}
	if to == from {
		return nil, apiErr(agentv1.CodeBadRequest, "rank %d of %s is on %s already", rank, name, to)
	}
	if _, ok := live[to]; !ok {
		return nil, apiErr(coordv1.CodeNodeDead, "node %s is not a live node of the cluster", to)
	}
	if err := checkCPU(j, []coordv1.Node{live[to]}, []string{to}); err != nil {
		return nil, err
	}
	var seq int
	if j, err = c.rec.updateJob(ctx, name, func(j *coordv1.Job) error {
		seq = j.NextCkpt
		j.NextCkpt++
		return nil
	}); err != nil {
		return nil, err
	}
	m := &coordv1.Migration{Job: name, Seq: seq, Rank: rank, From: from, To: to, State: coordv1.MigrationRunning, Started: time.Now().UTC(), PostCopy: req.PostCopy}
	if err := c.cat.Create(ctx, migKey(name, seq), m); err != nil {
		return nil, err
	}
	c.log.Info("migration started", "job", name, "rank", rank, "node", from, "peer", to, "ckpt", seq)
	c.publish(evv1.Event{Type: evv1.MigrationStarted, Job: name, Rank: evv1.IntPtr(rank), Ckpt: seq, Node: from, Peer: to})
	return mg.runMigration(ctx, j, m, machine.MigrationConfig{Job: name, Rank: rank, From: from, To: to, Placement: j.Placement})
}

// runMigration runs the migration m of j, as cfg describes it, to its
// end, and returns its record.
func (mg *migrations) runMigration(ctx context.Context, j *coordv1.Job, m *coordv1.Migration, cfg machine.MigrationConfig) (*coordv1.Migration, error) {
	c := mg.c
	mm, err := machine.NewMigration(cfg)
	if err != nil {
		return nil, err
	}
	log := c.log.With("job", m.Job, "rank", m.Rank, "ckpt", m.Seq)
	x, err := c.runs.newJobRun(ctx, j, log)
	if err != nil {
		return nil, err
	}
	x.ckpt, x.placement, x.hold, x.postCopy = m.Seq, cfg.Placement, mg.migrationHold(), m.PostCopy
	start := time.Now()
	damaged := ""
	x.observe = func(a machine.Action, res machine.Result) {
		x.mu.Lock()
		defer x.mu.Unlock()
		switch a.(type) {
		case machine.PrepareRank:
			if isDamaged(res.Err) {
				damaged = res.Err.Error()
			}
			if res.Err == nil {
				m.Dump, m.MemoryWait = x.prepared.Dump, x.prepared.MemoryWait
				e := migrationEvent(m, evv1.MigrationStalled, m.From, m.To)
				e.Duration, e.Bytes = time.Since(start), x.prepared.Size
				c.publish(e)
			}
		case machine.MoveIn:
			m.Bytes, m.Move, m.Restore = x.movedIn.Bytes, x.movedIn.Move, x.movedIn.Restore
			if res.Err == nil {
				e := migrationEvent(m, evv1.MigrationMoved, m.From, m.To)
				e.Duration, e.Bytes = m.Move, m.Bytes
				c.publish(e)
				e = migrationEvent(m, evv1.MigrationRestored, m.To, "")
				e.Duration = m.Restore
				c.publish(e)
			}
		}
	}
	x.persist = func(ctx context.Context, p machine.Persist) error {
		switch p.Phase {
		case machine.PhasePlaced, machine.PhaseUnplaced:
			on, was, step := m.To, m.From, 1
			if p.Phase == machine.PhaseUnplaced {
				on, was, step = m.From, m.To, -1
			}
			_, err := c.rec.updateJob(ctx, m.Job, func(jj *coordv1.Job) error {
				if jj.Placement[m.Rank] != was && jj.Placement[m.Rank] != on {
					return fmt.Errorf("rank %d of %s is on %s, neither %s nor %s", m.Rank, m.Job, jj.Placement[m.Rank], was, on)
				}
				if jj.Placement[m.Rank] == was {
					jj.Placement[m.Rank] = on
					jj.Migrations += step
				}
				return nil
			})
			return err
		case machine.PhaseDone, machine.PhaseFailed:
			x.mu.Lock()
			if !x.resumedAt.IsZero() {
				m.Resume = time.Since(x.resumedAt)
			}
			x.mu.Unlock()
			m.Stall, m.Finished = time.Since(start), time.Now().UTC()
			m.State, m.Reason = coordv1.MigrationDone, p.Reason
			if p.Phase == machine.PhaseFailed {
				m.State = coordv1.MigrationFailed
			}
			return c.cat.Put(ctx, migKey(m.Job, m.Seq), m)
		}
		return fmt.Errorf("migration: no phase %s", p.Phase)
	}
	done, err := x.drive(ctx, mm)
	if err != nil {
		return m, fmt.Errorf("migrate %s/%d from %s to %s: %w", m.Job, m.Rank, m.From, m.To, err)
	}
	err = mg.ended(log, m, doneErr(done))
	x.mu.Lock()
	// A damaged rank cannot run where it was: the supervisor restarts the
	// job from its newest checkpoint (once this migration lets go of it).
	ended := policy.MigrationEnded{Job: m.Job, Rank: m.Rank, Damaged: damaged}
	x.mu.Unlock()
	c.sup.observe(ended)
	return m, err
}

// ended logs and publishes how migration m ended (failure: why it did not
// finish, if it did not) and returns its error.
func (mg *migrations) ended(log *slog.Logger, m *coordv1.Migration, failure error) error {
	c := mg.c
	switch m.State {
	case coordv1.MigrationDone:
		log.Info("migrated", "node", m.To, "peer", m.From, "stall", m.Stall, "dump", m.Dump, "move", m.Move, "restore", m.Restore, "bytes", m.Bytes)
		e := migrationEvent(m, evv1.MigrationDone, m.To, m.From)
		e.Duration, e.Bytes = m.Stall, m.Bytes
		e.Message = fmt.Sprintf("dump %s, move %s, restore %s, resume %s", m.Dump.Round(time.Millisecond), m.Move.Round(time.Millisecond),
			m.Restore.Round(time.Millisecond), m.Resume.Round(time.Millisecond))
		if m.Reason != "" {
			e.Message += "; " + m.Reason
		}
		c.publish(e)
		if m.Reason != "" {
			return fmt.Errorf("migrate %s/%d: resumed with errors: %s", m.Job, m.Rank, m.Reason)
		}
		return nil
	case coordv1.MigrationFailed:
		log.Warn("migration failed; the job resumed where it was", "err", m.Reason)
		e := migrationEvent(m, evv1.MigrationFailed, m.From, m.To)
		e.Duration, e.Message = m.Stall, m.Reason
		c.publish(e)
	}
	return fmt.Errorf("migrate %s/%d from %s to %s: %w", m.Job, m.Rank, m.From, m.To, failure)
}

// migrationEvent is an event of type typ of migration m.
func migrationEvent(m *coordv1.Migration, typ, node, peer string) evv1.Event {
	return evv1.Event{Type: typ, Job: m.Job, Rank: evv1.IntPtr(m.Rank), Ckpt: m.Seq, Node: node, Peer: peer}
}

// migrationTarget picks where a rank goes when the caller does not say:
// a live spare, else the least loaded live node that is not drained, never
// the rank's own node.
func (mg *migrations) migrationTarget(ctx context.Context, j *coordv1.Job, from string) (string, error) {
	c := mg.c
	cands, err := c.rec.candidates(ctx, nil, true)
	if err != nil {
		return "", err
	}
	var best *coordv1.Node
	lackCPU := 0
	for i := range cands {
		n := &cands[i]
		if n.Name == from || n.Drained || len(n.Health) > 0 {
			continue
		}
		if len(cpufeat.Missing(j.CPU, n.CPU)) > 0 {
			lackCPU++
			continue
		}
		if best == nil || (n.Spare && !best.Spare) || (n.Spare == best.Spare && n.Ranks < best.Ranks) {
			best = n
		}
	}
	if best == nil && lackCPU > 0 {
		return "", apiErr(coordv1.CodeNoNodes, "no live node to move a rank of %s to: %d lack CPU features its ranks started with (%s)", j.Name, lackCPU, lacking(j, cands))
	}
	if best == nil {
		return "", apiErr(coordv1.CodeNoNodes, "no live node to move a rank of %s to", j.Name)
	}
	return best.Name, nil
}

// Migrations lists a job's migrations, oldest first.
func (c *Coordinator) Migrations(ctx context.Context, job string) ([]coordv1.Migration, error) {
	if _, err := c.rec.job(ctx, job); err != nil {
		return nil, err
	}
	return listBySeq(ctx, c, migPrefix(job), func(m coordv1.Migration) int { return m.Seq })
}

// Drain moves every rank off a node, spares first, and marks the node
// drained: no rank is placed there until it is undrained. A rank that
// cannot move is reported and the node stays drained (nothing new comes);
// run drain again, or restart the job.
func (c *Coordinator) Drain(ctx context.Context, node string, req coordv1.Drain) (*coordv1.DrainResult, error) {
	undrain := req.Undrain
	var n coordv1.Node
	err := c.cat.Update(ctx, nodeKey(node), &n, func() error {
		n.Drained = !undrain
		return nil
	})
	if errors.Is(err, catalog.ErrNotFound) {
		return nil, apiErr(agentv1.CodeNotFound, "no node %s", node)
	}
	if err != nil {
		return nil, err
	}
	out := &coordv1.DrainResult{Node: n}
	if undrain {
		c.publish(evv1.Event{Type: evv1.NodeUndrained, Node: node})
		return out, nil
	}
	c.log.Info("draining node", "node", node)
	jobs, err := c.Jobs(ctx)
	if err != nil {
		return out, err
	}
	var errs []error
	for _, j := range jobs {
		if j.State != coordv1.JobRunning {
			continue
		}
		for r, on := range j.Placement {
			if on != node {
				continue
			}
			m, err := c.Migrate(ctx, j.Name, coordv1.Migrate{Rank: r, PostCopy: req.PostCopy})
			if m != nil {
				out.Migrations = append(out.Migrations, *m)
			}
			if err != nil && (m == nil || m.State != coordv1.MigrationDone) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, err
	}
	c.publish(evv1.Event{Type: evv1.NodeDrained, Node: node, Message: fmt.Sprintf("%d rank(s) moved away", len(out.Migrations))})
	return out, nil
}

// recoverMigrations finishes the migrations an earlier coordinator left
// unfinished: one whose rank the job's record places on its target (the
// commit point had passed) is finished; any other is undone, as a failure
// before the commit point would have been. Agents would end their holds
// by themselves; this spares the job the wait.
func (mg *migrations) recoverMigrations(ctx context.Context) {
	c := mg.c
	jobs, err := c.Jobs(ctx)
	if err != nil {
		c.log.Warn("recover migrations", "err", err)
		return
	}
	for _, j := range jobs {
		ms, err := c.Migrations(ctx, j.Name)
		if err != nil {
			continue
		}
		for _, m := range ms {
			if m.State != coordv1.MigrationRunning {
				continue
			}
			mg.recoverMigration(ctx, &m)
		}
	}
}

func (mg *migrations) recoverMigration(ctx context.Context, m *coordv1.Migration) {
	c := mg.c
	defer c.locks.lock(m.Job)()
	j, err := c.rec.job(ctx, m.Job)
	if err != nil || m.Rank >= len(j.Placement) {
		return
	}
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return
	}
	_, fromAlive := live[m.From]
	cfg := machine.MigrationConfig{Job: m.Job, Rank: m.Rank, From: m.From, To: m.To, Placement: slices.Clone(j.Placement),
		Recover: true, Placed: j.Placement[m.Rank] == m.To, FromLost: !fromAlive}
	cfg.Placement[m.Rank] = m.From // the placement before the move
	c.log.Info("finishing a migration an earlier coordinator left", "job", m.Job, "rank", m.Rank, "ckpt", m.Seq, "placed", cfg.Placed)
	if _, err := mg.runMigration(ctx, j, m, cfg); err != nil {
		c.log.Warn("finishing a migration", "job", m.Job, "rank", m.Rank, "ckpt", m.Seq, "err", err)
	}
}
