package coord

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord/policy"
)

// nodeReports takes what the nodes tell with their joins and heartbeats:
// their leases, health probes, quarantined packs and ended ranks. A
// change is recorded and published, and told to the supervisor.
type nodeReports struct {
	c *Coordinator

	mu      sync.Mutex
	members map[string]*catalog.Membership // the lease of each node
	health  map[string][]string            // failing health probes by node, as last heard
	// quarantined: damaged packs in each node's store, as last heard
	quarantined map[string][]string
	// ended: the rank containers each node reported ended, as last heard
	ended map[string]map[string]bool
	// swept: when each node's live ranks were last looked at (strays)
	swept map[string]time.Time
	// heard: when each node last joined or sent a heartbeat to this
	// coordinator
	heard map[string]time.Time
}

// hear notes that name was heard from now.
func (nr *nodeReports) hear(name string) {
	nr.mu.Lock()
	defer nr.mu.Unlock()
	if nr.heard == nil {
		nr.heard = map[string]time.Time{}
	}
	nr.heard[name] = time.Now()
}

// heardWithin returns the nodes of cands heard from within d of now, and
// those this coordinator has not heard from at all yet (it took over, say).
func (nr *nodeReports) heardWithin(cands []coordv1.Node, now time.Time, d time.Duration) []coordv1.Node {
	nr.mu.Lock()
	defer nr.mu.Unlock()
	return heardWithin(cands, nr.heard, now, d)
}

// heardWithin drops from cands the nodes whose last word in heard is more
// than d before now. Such a node is alive by its lease, which runs for a
// while yet, but it has missed heartbeats: most likely it is dead, and a
// rank placed there would fail its restart.
func heardWithin(cands []coordv1.Node, heard map[string]time.Time, now time.Time, d time.Duration) []coordv1.Node {
	return slices.DeleteFunc(slices.Clone(cands), func(n coordv1.Node) bool {
		at, ok := heard[n.Name]
		return ok && now.Sub(at) > d
	})
}

func (nr *nodeReports) register(ctx context.Context, name string) error {
	c := nr.c
	m, err := c.cat.Register(ctx, name, c.opts.NodeTTL)
	if err != nil {
		return err
	}
	nr.mu.Lock()
	old := nr.members[name]
	nr.members[name] = m
	nr.mu.Unlock()
	_ = old // its lease expires by itself; the key now belongs to m
	nr.hear(name)
	return nil
}

// heartbeat refreshes a node's lease. A node the catalog does not know
// must join again; a known node whose lease this coordinator does not
// hold (it restarted) gets a new one.
func (nr *nodeReports) heartbeat(ctx context.Context, name string) error {
	c := nr.c
	var n coordv1.Node
	if _, err := c.cat.Get(ctx, nodeKey(name), &n); err != nil {
		return err
	}
	nr.mu.Lock()
	m := nr.members[name]
	nr.mu.Unlock()
	if m != nil {
		err := m.KeepAlive(ctx)
		if err == nil {
			nr.hear(name)
			return nil
		}
		if !errors.Is(err, catalog.ErrLeaseExpired) {
			return err
		}
		c.log.Warn("node came back after its lease expired", "node", name)
	}
	return nr.register(ctx, name)
}

// noteHealth records what a node's heartbeat says of its health probes:
// a change is written to the node's record and published, and a node that
// turns unwell has each job with ranks on it act by its OnHealthWarning
// policy.
func (nr *nodeReports) noteHealth(ctx context.Context, node string, warnings []string) {
	c := nr.c
	nr.mu.Lock()
	if nr.health == nil {
		nr.health = map[string][]string{}
	}
	old, known := nr.health[node]
	nr.health[node] = warnings
	nr.mu.Unlock()
	if known && slices.Equal(old, warnings) {
		return
	}
	var n coordv1.Node
	err := c.cat.Update(ctx, nodeKey(node), &n, func() error {
		n.Health = warnings
		return nil
	})
	if err != nil {
		c.log.Warn("record node health", "node", node, "err", err)
	}
	if len(warnings) == 0 {
		if known && len(old) > 0 {
			c.log.Info("node healthy again", "node", node)
			c.publish(evv1.Event{Type: evv1.HealthOK, Node: node})
		}
		return
	}
	c.log.Warn("node unwell", "node", node, "probes", strings.Join(warnings, "; "))
	c.publish(evv1.Event{Type: evv1.HealthWarning, Node: node, Message: strings.Join(warnings, "; ")})
	if len(old) == 0 {
		c.sup.observe(policy.NodeUnwell{Node: node})
	}
}

// noteQuarantine publishes each damaged pack a node reports in its store's
// quarantine/ once: those not yet in the node's record are published and
// recorded.
func (nr *nodeReports) noteQuarantine(ctx context.Context, node string, packs []string) {
	c := nr.c
	nr.mu.Lock()
	if nr.quarantined == nil {
		nr.quarantined = map[string][]string{}
	}
	old, known := nr.quarantined[node]
	nr.mu.Unlock()
	if known && slices.Equal(old, packs) {
		return
	}
	var fresh []string
	var n coordv1.Node
	err := c.cat.Update(ctx, nodeKey(node), &n, func() error {
		fresh = fresh[:0]
		for _, p := range packs {
			if !slices.Contains(n.Quarantined, p) {
				fresh = append(fresh, p)
			}
		}
		n.Quarantined = packs
		return nil
	})
	if err != nil {
		c.log.Warn("record node quarantine", "node", node, "err", err)
		return
	}
	nr.mu.Lock()
	nr.quarantined[node] = packs
	nr.mu.Unlock()
	for _, p := range fresh {
		c.log.Warn("a node's store quarantined a damaged pack", "node", node, "pack", p)
		c.publish(evv1.Event{Type: evv1.StoreQuarantined, Node: node, Message: p})
	}
}

// noteEnded takes node's list of ended rank containers from a heartbeat;
// the jobs of those that were not in its last list are settled. A
// coordinator that starts anew settles every job its nodes report.
func (nr *nodeReports) noteEnded(node string, names []string) {
	c := nr.c
	cur := make(map[string]bool, len(names))
	jobs := map[string]bool{}
	nr.mu.Lock()
	if nr.ended == nil {
		nr.ended = map[string]map[string]bool{}
	}
	prev := nr.ended[node]
	for _, n := range names {
		cur[n] = true
		if job, _, ok := agentv1.ParseRankName(n); ok && !prev[n] {
			jobs[job] = true
		}
	}
	nr.ended[node] = cur
	nr.mu.Unlock()
	for job := range jobs {
		c.sup.observe(policy.RanksEnded{Job: job})
	}
}

// fenced decides what becomes of the ranks a node froze while no
// coordinator answered it (its self-fence), now that it is alive again:
// those its jobs still place on it are released (thawed), the others
// dropped (stopped there: a restart brought them back elsewhere, or their
// job is over). A job busy with a protocol is left for a later heartbeat
// (verdict).
func (nr *nodeReports) fenced(ctx context.Context, node string, names []string) (release, drop []string) {
	for _, jr := range ranksByJob(names, nil) {
		keep, stray := nr.verdict(ctx, node, jr.job, jr.ranks)
		release, drop = append(release, keep...), append(drop, stray...)
	}
	return release, drop
}

// strays returns the live rank containers of a node that no job places
// there, for the node to stop (their output kept): left by a job start or
// a restart whose undo could not reach the node, or by a job that ended
// or is gone. The ranks the node fenced are fenced's to decide. A node's
// ranks are looked at once every two node TTLs at most: each look reads
// the records of their jobs.
func (nr *nodeReports) strays(ctx context.Context, node string, live, fenced []string) []string {
	c := nr.c
	nr.mu.Lock()
	if nr.swept == nil {
		nr.swept = map[string]time.Time{}
	}
	if time.Since(nr.swept[node]) < 2*c.opts.NodeTTL || len(live) == 0 {
		nr.mu.Unlock()
		return nil
	}
	nr.swept[node] = time.Now()
	nr.mu.Unlock()
	var out []string
	for _, jr := range ranksByJob(live, fenced) {
		_, stray := nr.verdict(ctx, node, jr.job, jr.ranks)
		out = append(out, stray...)
	}
	return out
}

// jobRanks are ranks of one job.
type jobRanks struct {
	job   string
	ranks []int
}

// ranksByJob groups the rank containers' names of names, but those of
// except, by job, in the order the jobs first appear.
func ranksByJob(names, except []string) []jobRanks {
	var out []jobRanks
	at := map[string]int{}
	for _, name := range names {
		job, rank, ok := agentv1.ParseRankName(name)
		if !ok || slices.Contains(except, name) {
			continue
		}
		i, seen := at[job]
		if !seen {
			i = len(out)
			at[job] = i
			out = append(out, jobRanks{job: job})
		}
		out[i].ranks = append(out[i].ranks, rank)
	}
	return out
}

// verdict splits ranks of job that node holds into those the job places
// there (keep) and the others (drop: placed elsewhere, or of a job that
// ended or is gone), as rank container names. It decides nothing while
// the job is busy: its lock held (only tried), starting or restarting, or
// with a migration under way, whose protocol or recovery decides. Under
// the lock no restart can place a kept rank elsewhere: restarts take it
// too, and the node is alive again by then.
func (nr *nodeReports) verdict(ctx context.Context, node, job string, ranks []int) (keep, drop []string) {
	c := nr.c
	unlock, ok := c.locks.tryLock(job)
	if !ok {
		return nil, nil
	}
	defer unlock()
	j, err := c.rec.job(ctx, job)
	switch {
	case hasCode(err, agentv1.CodeNotFound):
	case err != nil:
		return nil, nil
	case j.State == coordv1.JobStarting || j.State == coordv1.JobRestarting:
		return nil, nil
	default:
		ms, err := c.Migrations(ctx, job)
		if err != nil || slices.ContainsFunc(ms, func(m coordv1.Migration) bool { return m.State == coordv1.MigrationRunning }) {
			return nil, nil
		}
	}
	for _, r := range ranks {
		name := agentv1.RankName(job, r)
		if err == nil && j.State == coordv1.JobRunning && r < len(j.Placement) && j.Placement[r] == node {
			keep = append(keep, name)
			continue
		}
		state := "gone"
		if err == nil {
			state = string(j.State)
		}
		c.log.Warn("a node holds a rank its job does not place there: stopping it", "node", node, "rank", name, "job_state", state)
		drop = append(drop, name)
	}
	return keep, drop
}
