package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
	"github.com/cairn-hpc/cairn/internal/model"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/testbed"
)

// ErrConfig marks a Config no run can be made of.
var ErrConfig = errors.New("bad chaos config")

// Defaults of a Config.
const (
	DefaultJob      = "chaos"
	DefaultRanks    = 2
	DefaultMessages = 10_000_000
	DefaultMTBF     = 2 * time.Minute
	DefaultRepair   = 20 * time.Second
)

// Bounds of a run's waits.
const (
	// warmupWithin bounds the wait for the job's first protected
	// checkpoint, when failures begin.
	warmupWithin = 10 * time.Minute
	// lostWithin bounds the wait for the coordinator to find a failed
	// node dead before it is repaired.
	lostWithin = time.Minute
	// cleanupWithin bounds what a run does after it was stopped: nodes
	// brought back, its job removed.
	cleanupWithin = 3 * time.Minute
	// statusEvery is how often a run prints where the job stands.
	statusEvery = 30 * time.Second
	// stuckAfter is how long the job may stay failed (a restart of it
	// failed) before the run gives up on it: the coordinator tries a
	// failed restart again a node TTL later, five times.
	stuckAfter = 2 * time.Minute
)

// Config is what a run does: the ring job it runs, and the failures.
type Config struct {
	// CLI is how the user calls cairn, in hints (default "cairn").
	CLI      string
	Job      string // its name
	Ranks    int    // one per node
	Messages int    // the ring job's size (cairn ringapp -messages)
	Replicas int    // copies of every rank image on other nodes (≥ 1)
	// MTBF is a node's mean time between failures; a failed node comes
	// back Repair later (and not before the coordinator has found it
	// dead).
	MTBF, Repair time.Duration
	// Duration is how long failures go on (0: until the job ends).
	Duration time.Duration
	Seed     uint64
	// LoseData: a failed node loses its disk (its data dir and staging)
	// too.
	LoseData bool
	// Keep leaves the job on the cluster afterwards (default: removed).
	Keep bool
}

// Check fills in the defaults of what cfg leaves zero and checks it: an
// error satisfying errors.Is(err, ErrConfig) says what is wrong.
func (cfg *Config) Check() error {
	cfg.defaults()
	return cfg.check()
}

func (cfg *Config) defaults() {
	if cfg.CLI == "" {
		cfg.CLI = "cairn"
	}
	if cfg.Job == "" {
		cfg.Job = DefaultJob
	}
	if cfg.Ranks == 0 {
		cfg.Ranks = DefaultRanks
	}
	if cfg.Messages == 0 {
		cfg.Messages = DefaultMessages
	}
	if cfg.MTBF == 0 {
		cfg.MTBF = DefaultMTBF
	}
	if cfg.Repair == 0 {
		cfg.Repair = DefaultRepair
	}
}

func (cfg Config) check() error {
	switch {
	case cfg.Ranks < 2:
		return fmt.Errorf("%w: %d ranks: the ring job needs 2 or more", ErrConfig, cfg.Ranks)
	case cfg.Messages < 1:
		return fmt.Errorf("%w: %d messages", ErrConfig, cfg.Messages)
	case cfg.Replicas < 1:
		return fmt.Errorf("%w: %d replicas: a job restarts by itself after a node loss only with 1 or more", ErrConfig, cfg.Replicas)
	case cfg.MTBF <= 0 || cfg.Repair < 0 || cfg.Duration < 0:
		return fmt.Errorf("%w: the MTBF must be positive, the repair time and duration not negative", ErrConfig)
	}
	return nil
}

// Env is what a run works with: the local cluster, the binaries its
// nodes' containers are managed with, a client of its coordinator, and
// the cairn binary the job's ranks run.
type Env struct {
	Cluster *testbed.Cluster
	Runtime testbed.Runtime
	Coord   *rpc.CoordClient
	Exe     string
	// Out gets a line for each thing that happens (nil: nothing).
	Out io.Writer
}

// Result is what a run found.
type Result struct {
	Job          string `json:"job"`
	Ranks        int    `json:"ranks"`
	Nodes        int    `json:"nodes"`         // the job's ranks run on that many nodes
	ClusterNodes int    `json:"cluster_nodes"` // that fail
	Replicas     int    `json:"replicas"`
	Messages     int    `json:"messages"`
	Seed         uint64 `json:"seed"`
	// NodeMTBF is a node's MTBF the failures were drawn at, JobMTBF the
	// job's it makes (NodeMTBF over Nodes): what the coordinator chose
	// the interval for.
	NodeMTBF time.Duration `json:"node_mtbf_ns"`
	JobMTBF  time.Duration `json:"job_mtbf_ns"`
	Repair   time.Duration `json:"repair_ns"`
	Duration time.Duration `json:"duration_ns,omitempty"`
	LoseData bool          `json:"lose_data,omitempty"`
	// From and To bound the window measured (Record).
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Measurement is the ETTR measured and predicted, and what they come
	// from.
	Measurement Measurement `json:"measurement"`
	// Interval is the coordinator's last choice of the job's interval.
	Interval *coordv1.Interval `json:"interval,omitempty"`
	// Output is rank 0's result, Expected what ringapp.Expected computes
	// for the job without any network; Exact says they are the same.
	Output   string     `json:"output"`
	Expected string     `json:"expected"`
	Exact    bool       `json:"exact"`
	Faults   []Injected `json:"faults"`
	Restarts []Restart  `json:"restarts"`
}

// runner is one run under way.
type runner struct {
	env   Env
	cfg   Config
	start time.Time
	nodes map[string]testbed.Node // as last (re)started

	// What the event stream brought, shared with its goroutine.
	mu      sync.Mutex
	samples []model.Sample
	events  []evv1.Event // of the job, and nodes lost
	follow  error        // why the event stream ended
	wake    chan struct{}

	from     time.Time            // when failures began
	seen     seen                 // what the events said so far
	failed   time.Time            // since when the job's record says failed
	down     map[string]time.Time // failed, not yet back: when they failed
	reviving map[string]bool
	revived  chan revived
	faults   []Injected
}

// revived is a node back from a repair (or an error).
type revived struct {
	node  testbed.Node
	fault Fault
	err   error
}

// Run runs the ring job on the local cluster under --checkpoint-every
// auto with cfg.Replicas copies, fails its nodes by a seeded schedule
// from its first protected checkpoint on, brings them back, and measures
// the job's ETTR against the model's (docs/planning.md, "ETTR under
// failures"). It returns once the job has ended and its result is
// checked; whatever happens, no node it failed is left down. A Result
// comes with an error when the job ended but the run could not be
// measured.
func Run(ctx context.Context, env Env, cfg Config) (_ *Result, err error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if env.Out == nil {
		env.Out = io.Discard
	}
	r := &runner{env: env, cfg: cfg, start: time.Now(), nodes: map[string]testbed.Node{},
		wake: make(chan struct{}, 1), down: map[string]time.Time{}, reviving: map[string]bool{},
		revived: make(chan revived, len(env.Cluster.Nodes))}
	names, err := r.checkCluster(ctx)
	if err != nil {
		return nil, err
	}

	// The event stream, from before the job starts.
	evctx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	go r.followEvents(evctx, time.Now().Add(-time.Second))

	j, err := env.Coord.RunJob(ctx, coordv1.RunJob{
		Name: cfg.Job, Ranks: cfg.Ranks, PerNode: 1, CheckpointAuto: true, MTBF: cfg.MTBF,
		Replicas: cfg.Replicas, OnFailure: coordv1.OnFailureRestart,
		Args: []string{env.Exe, "ringapp", "-messages", strconv.Itoa(cfg.Messages)},
	})
	if err != nil {
		return nil, fmt.Errorf("start job %s: %w", cfg.Job, err)
	}
	removeJob := !cfg.Keep
	defer func() { err = errors.Join(err, r.cleanup(ctx, removeJob)) }()
	r.printf("job %s: %d ranks on %s (one a node), %d messages, checkpoints auto, %d replica(s)",
		j.Name, j.Ranks, strings.Join(j.Placement, ","), cfg.Messages, cfg.Replicas)

	from, err := r.warmup(ctx)
	if err != nil {
		return nil, err
	}
	r.from = from
	to, err := r.inject(ctx, from, names)
	if err != nil {
		return nil, err
	}
	if err := r.reviveAll(ctx); err != nil {
		return nil, err
	}
	return r.finish(ctx, from, to, len(names))
}

// checkCluster checks that every node of the local cluster is alive, that
// there is a node to spare for restarts, and that the job does not exist
// yet; it returns the nodes' names.
func (r *runner) checkCluster(ctx context.Context) ([]string, error) {
	live, err := r.env.Coord.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	alive := map[string]bool{}
	for _, n := range live {
		alive[n.Name] = n.Alive && !n.Drained
	}
	var names []string
	for _, n := range r.env.Cluster.Nodes {
		if !alive[n.Name] {
			return nil, fmt.Errorf("node %s of the local cluster is not alive (or drained): bring it back first (%[2]s node revive %[1]s, %[2]s node undrain %[1]s)", n.Name, r.cfg.CLI)
		}
		r.nodes[n.Name] = n
		names = append(names, n.Name)
	}
	if len(names) < r.cfg.Ranks+1 {
		return nil, fmt.Errorf("%d ranks, one a node, need %d nodes or more (one to restart on), and the local cluster has %d: %s down, then %s up --nodes %d",
			r.cfg.Ranks, r.cfg.Ranks+1, len(names), r.cfg.CLI, r.cfg.CLI, r.cfg.Ranks+1)
	}
	if _, err := r.env.Coord.Status(ctx, r.cfg.Job); err == nil {
		return nil, fmt.Errorf("a job %[1]s exists: remove it (%[2]s rm -f %[1]s) or name another (--job)", r.cfg.Job, r.cfg.CLI)
	}
	return names, nil
}

// printf prints a line of the run's progress, after the time since the
// run began.
func (r *runner) printf(format string, args ...any) {
	fmt.Fprintf(r.env.Out, "[%7.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// followEvents keeps the job's events, its rank 0's progress and the
// nodes lost, from since on, until ctx is done.
func (r *runner) followEvents(ctx context.Context, since time.Time) {
	err := r.env.Coord.EachEvent(ctx, rpc.EventsQuery{Since: since, Follow: true}, func(e evv1.Event, _ []byte) {
		r.mu.Lock()
		defer r.mu.Unlock()
		switch {
		case e.Type == evv1.NodeLost:
		case e.Job != r.cfg.Job:
			return
		case e.Type == evv1.RankEvent:
			if e.Kind != rankv1.KindProgress || e.Rank == nil || *e.Rank != 0 {
				return
			}
			n, err := strconv.ParseFloat(e.Message, 64)
			if err != nil {
				return
			}
			r.samples = append(r.samples, model.Sample{At: e.Time, Count: n})
		}
		r.events = append(r.events, e)
		select {
		case r.wake <- struct{}{}:
		default:
		}
	})
	r.mu.Lock()
	r.follow = err
	if err == nil && ctx.Err() == nil {
		r.follow = errors.New("the coordinator's event stream ended")
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// seen is what the events said so far.
type seen struct {
	next        int       // events looked at
	protected   int       // the first protected checkpoint (0: none yet)
	protectedAt time.Time // when
	exited      bool
	failed      string               // the job failed, or was lost: why
	lost        map[string]time.Time // when each node was last found dead
	lastCount   float64
}

// look goes through the events since the last look, prints what
// matters, and fails if the job did or the event stream ended.
func (r *runner) look() error {
	s := &r.seen
	r.mu.Lock()
	evs := r.events[s.next:]
	s.next = len(r.events)
	if len(r.samples) > 0 {
		s.lastCount = r.samples[len(r.samples)-1].Count
	}
	follow := r.follow
	r.mu.Unlock()
	for _, e := range evs {
		switch e.Type {
		case evv1.CkptProtected:
			if s.protected == 0 {
				s.protected, s.protectedAt = e.Ckpt, e.Time
			}
		case evv1.JobRestarted:
			r.printf("job restarted from checkpoint %d %s (the restart took %s)", e.Ckpt, e.Message, e.Duration.Round(10*time.Millisecond))
		case evv1.JobRestartFailed:
			r.printf("a restart from checkpoint %d failed: %s", e.Ckpt, e.Message)
		case evv1.JobExited:
			s.exited = true
		case evv1.JobFailed, evv1.JobLost:
			s.failed = fmt.Sprintf("%s: %s", e.Type, e.Message)
		case evv1.NodeLost:
			if s.lost == nil {
				s.lost = map[string]time.Time{}
			}
			s.lost[e.Node] = e.Time
		}
	}
	if s.failed != "" {
		return fmt.Errorf("job %s ended: %s", r.cfg.Job, s.failed)
	}
	if follow != nil {
		return follow
	}
	return nil
}

// lastSample returns the job's newest progress report.
func (r *runner) lastSample() (model.Sample, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.samples) == 0 {
		return model.Sample{}, false
	}
	return r.samples[len(r.samples)-1], true
}

// warmup waits for the job's first protected checkpoint, then for its
// next progress report: the window's start.
func (r *runner) warmup(ctx context.Context) (time.Time, error) {
	deadline := time.After(warmupWithin)
	announced := false
	for {
		if err := r.look(); err != nil {
			return time.Time{}, err
		}
		if r.seen.exited {
			return time.Time{}, fmt.Errorf("job %s ended before its first checkpoint was protected: give it more messages (--messages)", r.cfg.Job)
		}
		if r.seen.protected > 0 {
			if !announced {
				r.printf("checkpoint %d protected: failures begin (a node's MTBF %s, repair %s, seed %d)", r.seen.protected, r.cfg.MTBF, r.cfg.Repair, r.cfg.Seed)
				announced = true
			}
			if last, ok := r.lastSample(); ok && !last.At.Before(r.seen.protectedAt) {
				return last.At, nil
			}
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-deadline:
			return time.Time{}, fmt.Errorf("job %s has no protected checkpoint after %s", r.cfg.Job, warmupWithin)
		case <-r.wake:
		case <-time.After(time.Second):
		}
	}
}

// inject fails and repairs nodes by the schedule from from on, until the
// job ends or the run's duration is over and the job runs again, and
// returns the window's end: the last progress report counted.
func (r *runner) inject(ctx context.Context, from time.Time, names []string) (time.Time, error) {
	// The schedule knows the nodes by their names less the cluster's
	// prefix ("n1"): a seed fails the same nodes at the same times on
	// every local cluster of as many nodes.
	prefix := r.env.Cluster.Prefix
	var short []string
	for _, n := range names {
		short = append(short, strings.TrimPrefix(n, prefix))
	}
	sched := NewSchedule(r.cfg.Seed, short, r.cfg.MTBF, r.cfg.Repair)
	nextFault := func() Fault {
		f, _ := sched.Next()
		f.Node = prefix + f.Node
		return f
	}
	next := nextFault()
	var stopAt time.Time
	if r.cfg.Duration > 0 {
		stopAt = from.Add(r.cfg.Duration)
	}
	status := time.NewTicker(statusEvery)
	defer status.Stop()
	check := time.NewTicker(5 * time.Second)
	defer check.Stop()
	var checked time.Time // the last report after stopAt the job's state was checked at
	over := false         // the duration is over, and the nodes down were brought back
	for {
		if err := r.look(); err != nil {
			return time.Time{}, err
		}
		last, _ := r.lastSample()
		if r.seen.exited {
			r.printf("job %s exited: the window closes at its last progress report", r.cfg.Job)
			return last.At, nil
		}
		stopping := !stopAt.IsZero() && !time.Now().Before(stopAt)
		if stopping && !over {
			r.printf("%s of failures over: the nodes down come back", r.cfg.Duration)
			if err := r.reviveAll(ctx); err != nil {
				return time.Time{}, err
			}
			over = true
		}
		if stopping && last.At.After(stopAt) && last.At.After(checked) {
			// The window closes at a report the job will keep: made once
			// it runs on none of the nodes that failed.
			checked = last.At
			back, err := r.jobBack(ctx)
			if err != nil {
				return time.Time{}, err
			}
			if back {
				r.printf("the job runs again: the window closes")
				return last.At, nil
			}
		}
		wait := time.Until(from.Add(next.At))
		if stopping {
			wait = time.Hour
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-r.wake:
			continue
		case rv := <-r.revived:
			if err := r.revivedNode(rv); err != nil {
				return time.Time{}, err
			}
			continue
		case <-status.C:
			r.status()
			continue
		case <-check.C:
			if err := r.checkJob(ctx); err != nil {
				return time.Time{}, err
			}
			continue
		case <-time.After(max(wait, 0)):
		}
		if stopping {
			continue
		}
		switch next.Kind {
		case Fail:
			if err := r.fail(ctx, next); err != nil {
				return time.Time{}, err
			}
		case Repair:
			r.repair(ctx, next)
		}
		next = nextFault()
	}
}

// checkJob fails when the job's record has said failed for stuckAfter:
// its restarts failed, and the coordinator no longer tries them.
func (r *runner) checkJob(ctx context.Context) error {
	j, err := r.job(ctx)
	if err != nil {
		return err
	}
	if j.State != coordv1.JobFailed && j.State != coordv1.JobLost {
		r.failed = time.Time{}
		return nil
	}
	if r.failed.IsZero() {
		r.failed = time.Now()
	}
	if time.Since(r.failed) < stuckAfter {
		return nil
	}
	return fmt.Errorf("job %s has been %s for %s (%s), and the coordinator does not restart it", j.Name, j.State, stuckAfter, j.Reason)
}

// job returns the job's record.
func (r *runner) job(ctx context.Context) (coordv1.Job, error) {
	jobs, err := r.env.Coord.Jobs(ctx)
	if err != nil {
		return coordv1.Job{}, err
	}
	for _, j := range jobs {
		if j.Name == r.cfg.Job {
			return j, nil
		}
	}
	return coordv1.Job{}, fmt.Errorf("job %s is gone", r.cfg.Job)
}

// jobBack says whether the job runs, on none of the nodes that failed and
// are not back.
func (r *runner) jobBack(ctx context.Context) (bool, error) {
	j, err := r.job(ctx)
	if err != nil || j.State != coordv1.JobRunning {
		return false, err
	}
	for _, n := range j.Placement {
		if _, down := r.down[n]; down {
			return false, nil
		}
	}
	return true, nil
}

// status prints where the job stands.
func (r *runner) status() {
	fails, hits := 0, 0
	for _, f := range r.faults {
		if f.Kind == Fail {
			fails++
			if f.Hit {
				hits++
			}
		}
	}
	r.printf("%.0f/%d messages; %d failures, %d of them of the job's nodes", r.seen.lastCount, r.cfg.Messages, fails, hits)
}

// fail fails a node; the fault records whether a rank of the job's was
// there.
func (r *runner) fail(ctx context.Context, f Fault) error {
	for r.reviving[f.Node] {
		// Still coming back from its last failure: it fails once back.
		if err := r.revivedNode(<-r.revived); err != nil {
			return err
		}
	}
	j, err := r.job(ctx)
	if err != nil {
		return err
	}
	var ranks []int
	for rank, n := range j.Placement {
		if n == f.Node {
			ranks = append(ranks, rank)
		}
	}
	in := Injected{Fault: f, Time: time.Now(), Hit: len(ranks) > 0}
	r.down[f.Node] = in.Time
	r.faults = append(r.faults, in)
	what := "no rank of the job there"
	if in.Hit {
		var rs []string
		for _, rank := range ranks {
			rs = append(rs, strconv.Itoa(rank))
		}
		what = "the job's rank " + strings.Join(rs, ",") + " there"
	}
	r.printf("%s fails (%s)", f.Node, what)
	// A node fails whole, even if the run is being stopped meanwhile.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupWithin)
	defer cancel()
	if err := r.nodes[f.Node].Fail(fctx, r.env.Runtime, r.cfg.LoseData); err != nil {
		return fmt.Errorf("fail node %s: %w", f.Node, err)
	}
	return nil
}

// repair brings a failed node back in the background, once the
// coordinator has found it dead.
func (r *runner) repair(ctx context.Context, f Fault) {
	node := f.Node
	if !r.awaitLost(ctx, node) {
		return // the clean-up brings it back
	}
	r.reviving[node] = true
	r.printf("%s comes back", node)
	go func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupWithin)
		defer cancel()
		n, err := r.env.Cluster.Revive(rctx, node)
		if n.Name == "" {
			n.Name = node
		}
		r.revived <- revived{n, f, err}
	}()
}

// awaitLost waits until the coordinator has found node dead since it
// failed (a node back before that would have its ranks vanish without a
// failure, and its failure go unseen), at most lostWithin after the
// failure. It reports false if ctx ended first.
func (r *runner) awaitLost(ctx context.Context, node string) bool {
	failed := r.down[node]
	for r.seen.lost[node].Before(failed) {
		if time.Since(failed) > lostWithin {
			r.printf("the coordinator has not found %s dead %s after it failed; it comes back anyway", node, lostWithin)
			break
		}
		select {
		case <-ctx.Done():
			return false
		case <-r.wake:
		case <-time.After(100 * time.Millisecond):
		}
		if err := r.look(); err != nil {
			break // the caller sees it at its next look
		}
	}
	return true
}

// revivedNode records a node back.
func (r *runner) revivedNode(rv revived) error {
	delete(r.reviving, rv.node.Name)
	if rv.err != nil {
		return rv.err
	}
	delete(r.down, rv.node.Name)
	if rv.node.PID != 0 {
		r.nodes[rv.node.Name] = rv.node
	}
	r.faults = append(r.faults, Injected{Fault: rv.fault, Time: time.Now()})
	return nil
}

// reviveAll brings back every node still down, each once the coordinator
// has found it dead, and waits for those coming back.
func (r *runner) reviveAll(ctx context.Context) error {
	var errs []error
	for len(r.reviving) > 0 {
		errs = append(errs, r.revivedNode(<-r.revived))
	}
	for _, node := range slices.Sorted(maps.Keys(r.down)) {
		// Not before it is found dead, as in the run (unless the run is
		// being stopped).
		r.awaitLost(ctx, node)
		r.printf("%s comes back", node)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupWithin)
		n, err := r.env.Cluster.Revive(rctx, node)
		cancel()
		if errors.Is(err, testbed.ErrAgentRuns) {
			err = nil // it came back already
		}
		if n.Name == "" {
			n.Name = node
		}
		f := Fault{Node: node, Kind: Repair}
		if !r.from.IsZero() {
			f.At = time.Since(r.from)
		}
		errs = append(errs, r.revivedNode(revived{n, f, err}))
	}
	return errors.Join(errs...)
}

// cleanup brings every node back and, if asked, removes the job: after a
// run, and whenever one stops early.
func (r *runner) cleanup(ctx context.Context, removeJob bool) error {
	errs := []error{r.reviveAll(ctx)}
	if removeJob {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupWithin)
		defer cancel()
		if _, err := r.env.Coord.RemoveJob(cctx, r.cfg.Job, true); err != nil {
			errs = append(errs, fmt.Errorf("remove job %s: %w", r.cfg.Job, err))
		}
	}
	return errors.Join(errs...)
}

var resultRE = regexp.MustCompile(`(?m)^result=([0-9a-f]+)$`)

// finish waits for the job to end, checks its result, and measures the
// window.
func (r *runner) finish(ctx context.Context, from, to time.Time, clusterNodes int) (*Result, error) {
	r.printf("waiting for the job to end, to check its result")
	st, err := r.env.Coord.WaitJob(ctx, r.cfg.Job, time.Second)
	if err != nil {
		return nil, fmt.Errorf("wait for job %s: %w", r.cfg.Job, err)
	}
	if st.Failed {
		return nil, fmt.Errorf("job %s failed: %s", r.cfg.Job, st.Reason)
	}
	ra, err := r.env.Coord.RankAgents(ctx, r.cfg.Job)
	if err != nil {
		return nil, err
	}
	var log bytes.Buffer
	if err := ra.Log(ctx, &log, 0, agentv1.LogQuery{}); err != nil {
		return nil, fmt.Errorf("rank 0's output: %w", err)
	}
	res := &Result{Job: r.cfg.Job, Ranks: r.cfg.Ranks, Nodes: r.cfg.Ranks, ClusterNodes: clusterNodes,
		Replicas: r.cfg.Replicas, Messages: r.cfg.Messages, Seed: r.cfg.Seed, NodeMTBF: r.cfg.MTBF,
		JobMTBF: model.JobMTBF(r.cfg.MTBF, r.cfg.Ranks), Repair: r.cfg.Repair, Duration: r.cfg.Duration,
		LoseData: r.cfg.LoseData, From: from, To: to, Interval: st.Interval,
		Expected: ringapp.Expected(r.cfg.Ranks, r.cfg.Messages, ringapp.DefaultWindow, 1)}
	if m := resultRE.FindAllSubmatch(log.Bytes(), -1); len(m) > 0 {
		res.Output = string(m[len(m)-1][1])
	}
	res.Exact = res.Output == res.Expected
	ckpts, err := r.env.Coord.Checkpoints(ctx, r.cfg.Job)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	rec := Record{From: from, To: to, Samples: slices.Clone(r.samples), Ckpts: ckpts, Faults: r.faults}
	var begun time.Time // the last restart attempt's
	for _, e := range r.events {
		switch e.Type {
		case evv1.JobRestarting:
			begun = e.Time
		case evv1.JobRestarted:
			rec.Restarts = append(rec.Restarts, Restart{Begun: begun, Done: e.Time, Ckpt: e.Ckpt, Took: e.Duration})
		}
	}
	r.mu.Unlock()
	res.Faults, res.Restarts = rec.Faults, rec.Restarts
	if res.Measurement, err = Measure(rec); err != nil {
		return res, fmt.Errorf("measure the run: %w", err)
	}
	return res, nil
}
