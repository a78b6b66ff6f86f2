package coord

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	agentv1 "cairn/api/agent/v1"
	v1 "cairn/api/coord/v1"
	evv1 "cairn/api/events/v1"
	"cairn/internal/catalog"
	"cairn/internal/failpoint"
)

func migPrefix(job string) string       { return "migrations/" + job + "/" }
func migKey(job string, seq int) string { return fmt.Sprintf("migrations/%s/%08d", job, seq) }

// migrationHold is how long agents keep ranks stalled for a migration
// before they give up on the coordinator.
func (c *Coordinator) migrationHold() time.Duration { return c.opts.Hold + time.Minute }

// Migrate moves one rank of a running job to another node while the rest
// of the job waits, in four phases (design.md §2):
//
//  1. stall: every other rank is locked and frozen where it is, and the
//     moving rank is prepared on its node as for a checkpoint (network
//     locked, frozen, dumped into tmpfs staging);
//  2. move: the target agent pulls the staged image straight from the
//     source's staging (no copy on either disk first);
//  3. restore: the target restores the rank from its staging, frozen,
//     its network locked, with its address;
//  4. resume: the source's copy is removed, every node's job network
//     points at the rank's new node, and every rank resumes.
//
// Until phase 4 begins, any failure undoes the migration: the target's
// copy is removed and every rank, the moving one included, runs again
// where it was. to may be empty: a spare, else the least loaded node.
func (c *Coordinator) Migrate(ctx context.Context, name string, rank int, to string) (*v1.Migration, error) {
	defer c.lockJob(name)()
	return c.migrate(ctx, name, rank, to)
}

func (c *Coordinator) migrate(ctx context.Context, name string, rank int, to string) (*v1.Migration, error) {
	j, err := c.job(ctx, name)
	if err != nil {
		return nil, err
	}
	if j.State != v1.JobRunning {
		return nil, apiErr(v1.CodeConflict, "job %s is %s: only a running job's ranks can migrate", name, j.State)
	}
	if rank < 0 || rank >= len(j.Placement) {
		return nil, apiErr(agentv1.CodeBadRequest, "job %s has no rank %d", name, rank)
	}
	from := j.Placement[rank]
	live, err := c.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range j.Placement {
		if _, ok := live[n]; !ok {
			return nil, apiErr(v1.CodeNodeDead, "node %s of job %s is dead: restart the job instead", n, name)
		}
	}
	if to == "" {
		if to, err = c.migrationTarget(ctx, j, from); err != nil {
			return nil, err
		}
	}
	if to == from {
		return nil, apiErr(agentv1.CodeBadRequest, "rank %d of %s is on %s already", rank, name, to)
	}
	if _, ok := live[to]; !ok {
		return nil, apiErr(v1.CodeNodeDead, "node %s is not a live node of the cluster", to)
	}
	var seq int
	if j, err = c.updateJob(ctx, name, func(j *v1.Job) error {
		seq = j.NextCkpt
		j.NextCkpt++
		return nil
	}); err != nil {
		return nil, err
	}
	m := &v1.Migration{Job: name, Seq: seq, Rank: rank, From: from, To: to, State: v1.MigrationRunning, Started: time.Now().UTC()}
	if err := c.cat.Create(ctx, migKey(name, seq), m); err != nil {
		return nil, err
	}
	log := c.log.With("job", name, "rank", rank, "from", from, "to", to, "seq", seq)
	log.Info("migration started")
	c.publish(evv1.Event{Type: evv1.MigrationStarted, Job: name, Rank: evv1.IntPtr(rank), Ckpt: seq, Node: from, Peer: to})
	hold := c.migrationHold()
	start := time.Now()

	stay := ranksByNode(name, j.Placement, rank) // the ranks that stay, by node
	recorded := false                            // the rank's new node is in the catalog
	fail := func(phase string, err error) (*v1.Migration, error) {
		log.Warn("migration failed; resuming the job where it was", "phase", phase, "err", err)
		if recorded {
			if _, err := c.updateJob(context.WithoutCancel(ctx), name, func(jj *v1.Job) error {
				jj.Placement[rank] = from
				jj.Migrations--
				return nil
			}); err != nil {
				log.Warn("migration: record the rank back on its node", "err", err)
			}
		}
		c.undoMigration(context.WithoutCancel(ctx), j, rank, seq, to, stay)
		if isDamaged(err) {
			// The rank cannot run on where it was: the job restarts from
			// its newest checkpoint (once this migration lets go of it).
			c.rankDamaged(name, err.Error())
		}
		m.State, m.Reason, m.Finished, m.Stall = v1.MigrationFailed, phase+": "+err.Error(), time.Now().UTC(), time.Since(start)
		_ = c.cat.Put(context.WithoutCancel(ctx), migKey(name, seq), m)
		c.publish(evv1.Event{Type: evv1.MigrationFailed, Job: name, Rank: evv1.IntPtr(rank), Ckpt: seq, Node: from, Peer: to,
			Duration: m.Stall, Message: m.Reason})
		return m, fmt.Errorf("migrate %s/%d from %s to %s: %s: %w", name, rank, from, to, phase, err)
	}

	// 1. Stall: the others frozen and locked, the moving rank dumped.
	var wg sync.WaitGroup
	var emu sync.Mutex
	var errs []error
	note := func(err error) {
		emu.Lock()
		errs = append(errs, err)
		emu.Unlock()
	}
	for n, ranks := range stay {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := c.client(ctx, n)
			if err == nil {
				err = cl.RankStall(ctx, agentv1.RankStall{Ranks: ranks, Hold: hold})
			}
			if err != nil {
				note(fmt.Errorf("stall on %s: %w", n, err))
			}
		}()
	}
	var prep agentv1.Prepared
	wg.Add(1)
	go func() {
		defer wg.Done()
		cl, err := c.client(ctx, from)
		if err == nil {
			prep, err = cl.Prepare(ctx, agentv1.Prepare{Rank: agentv1.Rank{Job: name, Rank: rank}, Seq: seq, Hold: hold})
		}
		if err != nil {
			note(fmt.Errorf("dump on %s: %w", from, err))
		}
	}()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail("stall", err)
	}
	m.Dump = prep.Dump
	c.publish(evv1.Event{Type: evv1.MigrationStalled, Job: name, Rank: evv1.IntPtr(rank), Ckpt: seq, Node: from, Peer: to,
		Duration: time.Since(start), Bytes: prep.Size})

	// 2, 3. Move and restore, on the target.
	tcl, err := c.client(ctx, to)
	if err != nil {
		return fail("move", err)
	}
	moved := *j
	moved.Placement = append([]string(nil), j.Placement...)
	moved.Placement[rank] = to
	underlays := c.underlays(ctx)
	in, err := tcl.MigrateIn(ctx, agentv1.MigrateIn{
		Rank: agentv1.Rank{Job: name, Rank: rank}, Seq: seq, From: live[from].Addr, FromNode: from,
		Net: jobNet(&moved, to, underlays), Addr: j.Addrs[rank], Hold: hold,
	})
	m.Bytes, m.Move, m.Restore = in.Bytes, in.Move, in.Restore
	if err != nil {
		return fail("move", err)
	}
	c.publish(evv1.Event{Type: evv1.MigrationMoved, Job: name, Rank: evv1.IntPtr(rank), Ckpt: seq, Node: from, Peer: to,
		Duration: in.Move, Bytes: in.Bytes})
	c.publish(evv1.Event{Type: evv1.MigrationRestored, Job: name, Rank: evv1.IntPtr(rank), Ckpt: seq, Node: to,
		Duration: in.Restore})

	// 4. Resume. From here on the rank lives on the target, and the
	// catalog says so first: a coordinator that dies from now on is
	// followed by one that finishes the migration (recoverMigration
	// removes the source, then resumes). Recorded after the source's
	// removal, a death between the two would have the next coordinator
	// undo the migration onto a source that is gone. The source's copy
	// goes before anything runs, so that the two never run together,
	// while every node's job network is pointed at the rank's new node.
	resumeStart := time.Now()
	if _, err := c.updateJob(context.WithoutCancel(ctx), name, func(jj *v1.Job) error {
		jj.Placement[rank] = to
		jj.Migrations++
		return nil
	}); err != nil {
		return fail("record the new placement", err)
	}
	recorded = true
	failpoint.Hold(ctx, "migration-before-remove", c.log)
	nodes := map[string][]agentv1.Rank{}
	for n, ranks := range stay {
		nodes[n] = ranks
	}
	nodes[to] = append(nodes[to], agentv1.Rank{Job: name, Rank: rank})
	errs = nil
	var outErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		scl, err := c.client(ctx, from)
		if err == nil {
			err = scl.MigrateOut(ctx, agentv1.MigrateOut{Rank: agentv1.Rank{Job: name, Rank: rank}, Seq: seq, VNI: j.VNI, Addr: j.Addrs[rank]})
		}
		outErr = err
	}()
	for n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := c.client(ctx, n)
			if err == nil {
				err = cl.JobNet(ctx, jobNet(&moved, n, underlays))
			}
			if err != nil {
				note(fmt.Errorf("job network on %s: %w", n, err))
			}
		}()
	}
	wg.Wait()
	if outErr != nil {
		return fail("remove the source", outErr)
	}
	failpoint.Hold(ctx, "migration-before-resume", c.log)
	ctx = context.WithoutCancel(ctx)
	if err := c.resumeRanks(ctx, nodes); err != nil {
		note(err)
	}
	m.Resume, m.Stall = time.Since(resumeStart), time.Since(start)
	if _, ok := nodes[from]; !ok {
		// The source keeps no rank of the job: its job network goes.
		if cl, err := c.client(ctx, from); err == nil {
			_ = cl.DeleteJobNet(ctx, j.VNI)
		}
	}
	m.Finished = time.Now().UTC()
	m.State = v1.MigrationDone
	if err := errors.Join(errs...); err != nil {
		m.Reason = err.Error()
	}
	_ = c.cat.Put(ctx, migKey(name, seq), m)
	log.Info("migrated", "stall", m.Stall, "dump", m.Dump, "move", m.Move, "restore", m.Restore, "bytes", m.Bytes)
	c.publish(evv1.Event{Type: evv1.MigrationDone, Job: name, Rank: evv1.IntPtr(rank), Ckpt: seq, Node: to, Peer: from,
		Duration: m.Stall, Bytes: m.Bytes, Message: fmt.Sprintf("dump %s, move %s, restore %s, resume %s",
			m.Dump.Round(time.Millisecond), m.Move.Round(time.Millisecond),
			m.Restore.Round(time.Millisecond), m.Resume.Round(time.Millisecond))})
	if len(errs) > 0 {
		return m, fmt.Errorf("migrate %s/%d: resumed with errors: %w", name, rank, errors.Join(errs...))
	}
	return m, nil
}

// undoMigration puts a job back as it was before a migration that failed
// before its phase 4: the target's copy goes, the moving rank is thawed
// on its node (its prepare aborted) and the other ranks resume. Agents
// that cannot be reached do the same by themselves when their hold ends.
func (c *Coordinator) undoMigration(ctx context.Context, j *v1.Job, rank, seq int, to string, stay map[string][]agentv1.Rank) {
	if cl, err := c.client(ctx, to); err == nil {
		_ = cl.RankRemove(ctx, agentv1.RankRemove{Rank: agentv1.Rank{Job: j.Name, Rank: rank}, VNI: j.VNI, Addr: j.Addrs[rank]})
		if !slices.Contains(j.Placement, to) {
			_ = cl.DeleteJobNet(ctx, j.VNI)
		}
	}
	var wg sync.WaitGroup
	// Job networks point at the rank's own node again (they may have been
	// pointed at the target already).
	underlays := c.underlays(ctx)
	for _, n := range slices.Compact(slices.Sorted(slices.Values(j.Placement))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if cl, err := c.client(ctx, n); err == nil {
				_ = cl.JobNet(ctx, jobNet(j, n, underlays))
			}
		}()
	}
	wg.Wait()
	from := j.Placement[rank]
	wg.Add(1)
	go func() {
		defer wg.Done()
		if cl, err := c.client(ctx, from); err == nil {
			_ = cl.Abort(ctx, agentv1.Finish{Rank: agentv1.Rank{Job: j.Name, Rank: rank}, Seq: seq})
		}
	}()
	_ = c.resumeRanks(ctx, stay)
	wg.Wait()
}

// migrationTarget picks where a rank goes when the caller does not say:
// a live spare, else the least loaded live node that is not drained, never
// the rank's own node.
func (c *Coordinator) migrationTarget(ctx context.Context, j *v1.Job, from string) (string, error) {
	cands, err := c.candidates(ctx, nil, true)
	if err != nil {
		return "", err
	}
	var best *v1.Node
	for i := range cands {
		n := &cands[i]
		if n.Name == from || n.Drained || len(n.Health) > 0 {
			continue
		}
		if best == nil || (n.Spare && !best.Spare) || (n.Spare == best.Spare && n.Ranks < best.Ranks) {
			best = n
		}
	}
	if best == nil {
		return "", apiErr(v1.CodeNoNodes, "no live node to move a rank of %s to", j.Name)
	}
	return best.Name, nil
}

// Migrations lists a job's migrations, oldest first.
func (c *Coordinator) Migrations(ctx context.Context, job string) ([]v1.Migration, error) {
	if _, err := c.job(ctx, job); err != nil {
		return nil, err
	}
	return listBySeq(ctx, c, migPrefix(job), func(m v1.Migration) int { return m.Seq })
}

// Drain moves every rank off a node, spares first, and marks the node
// drained: no rank is placed there until it is undrained. A rank that
// cannot move is reported and the node stays drained (nothing new comes);
// run drain again, or restart the job.
func (c *Coordinator) Drain(ctx context.Context, node string, undrain bool) (*v1.DrainResult, error) {
	var n v1.Node
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
	out := &v1.DrainResult{Node: n}
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
		if j.State != v1.JobRunning {
			continue
		}
		for r, on := range j.Placement {
			if on != node {
				continue
			}
			m, err := c.Migrate(ctx, j.Name, r, "")
			if m != nil {
				out.Migrations = append(out.Migrations, *m)
			}
			if err != nil && (m == nil || m.State != v1.MigrationDone) {
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
// unfinished: one whose rank is recorded on its target (the source is
// gone: phase 4 had begun) resumes every rank of the job; any other is
// undone, as a failure before phase 4 would have been. Agents would do the
// same by themselves when their holds end; this spares the job the wait.
func (c *Coordinator) recoverMigrations(ctx context.Context) {
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
			if m.State != v1.MigrationRunning {
				continue
			}
			c.recoverMigration(ctx, &m)
		}
	}
}

func (c *Coordinator) recoverMigration(ctx context.Context, m *v1.Migration) {
	defer c.lockJob(m.Job)()
	j, err := c.job(ctx, m.Job)
	if err != nil || m.Rank >= len(j.Placement) {
		return
	}
	log := c.log.With("job", m.Job, "rank", m.Rank, "seq", m.Seq)
	if j.Placement[m.Rank] == m.To {
		// The source may still hold its stalled copy: it goes first, so
		// that the two never run together (a dead source has none).
		if cl, err := c.client(ctx, m.From); err == nil {
			if err := cl.MigrateOut(ctx, agentv1.MigrateOut{Rank: agentv1.Rank{Job: m.Job, Rank: m.Rank}, Seq: m.Seq, VNI: j.VNI, Addr: j.Addrs[m.Rank]}); err != nil {
				log.Warn("finishing a migration: the source's copy could not be removed; not resuming", "node", m.From, "err", err)
				return
			}
		}
		// Every node's job network points at the rank's new node (the
		// earlier coordinator may have died before it said so).
		underlays := c.underlays(ctx)
		var errs []error
		for _, n := range slices.Compact(slices.Sorted(slices.Values(j.Placement))) {
			cl, err := c.client(ctx, n)
			if err == nil {
				err = cl.JobNet(ctx, jobNet(j, n, underlays))
			}
			errs = append(errs, err)
		}
		err := errors.Join(append(errs, c.resumeRanks(ctx, ranksByNode(m.Job, j.Placement, -1)))...)
		log.Info("finished a migration an earlier coordinator left in its last phase", "err", err)
		m.State, m.Reason = v1.MigrationDone, "finished by a restarted coordinator"
		c.publish(evv1.Event{Type: evv1.MigrationDone, Job: m.Job, Rank: evv1.IntPtr(m.Rank), Ckpt: m.Seq, Node: m.To, Peer: m.From, Message: m.Reason})
	} else {
		c.undoMigration(ctx, j, m.Rank, m.Seq, m.To, ranksByNode(m.Job, j.Placement, m.Rank))
		log.Info("undid a migration an earlier coordinator left unfinished")
		m.State, m.Reason = v1.MigrationFailed, "the coordinator died during it; undone by the next one"
		c.publish(evv1.Event{Type: evv1.MigrationFailed, Job: m.Job, Rank: evv1.IntPtr(m.Rank), Ckpt: m.Seq, Node: m.From, Peer: m.To, Message: m.Reason})
	}
	m.Finished = time.Now().UTC()
	if err := c.cat.Put(ctx, migKey(m.Job, m.Seq), m); err != nil {
		log.Warn("record a recovered migration", "err", err)
	}
}
