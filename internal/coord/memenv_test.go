package coord_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/traces/*.txt with the actual traces")

// memEnv is a cluster of in-memory agents (package memagent) and the
// coordinators that drive it, one after the other, over one real
// embedded etcd: the coordinator's protocols run as they do on a real
// cluster, minus containers and the network.
type memEnv struct {
	t    *testing.T
	ctx  context.Context
	etcd *catalog.Embedded
	mc   *memagent.Cluster
	opts coord.Options
	n    int       // coordinators started
	last *memCoord // the one that took over, for checks
	// wrap, if set, stands between the coordinators and each node's
	// agent (a test's gate or count).
	wrap func(node string, a coord.Agent) coord.Agent

	mu    sync.Mutex
	trace []string
}

// memCoord is one coordinator of a memEnv.
type memCoord struct {
	*coord.Coordinator
	name   string
	cat    *catalog.Catalog
	ctx    context.Context // ends when it dies
	cancel context.CancelFunc
	wait   func()
	dead   bool
}

const memTTL = 2 * time.Second // etcd's shortest lease

// newMemEnv makes nodes n0..n(nodes-1) and an etcd; opts are the
// coordinators' options (Dial and Trace are the env's).
func newMemEnv(t *testing.T, nodes int, mopts memagent.Options, opts coord.Options) *memEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &memEnv{t: t, ctx: ctx, opts: opts}
	mopts.Record = func(caller, call string) { e.note(caller, call) }
	e.mc = memagent.New(mopts)
	for i := range nodes {
		e.mc.AddNode(fmt.Sprintf("n%d", i))
	}
	var err error
	// In tmpfs: the nodes' 2 s leases are renewed by writes that etcd
	// fsyncs, and the data disk of a machine running the end-to-end
	// tests beside this package can take longer than that to sync.
	dir, err := os.MkdirTemp("/dev/shm", "cairn-memenv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e.etcd, err = catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		e.etcd.Close()
	})
	return e
}

func (e *memEnv) note(who, line string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.trace = append(e.trace, who+" "+line)
}

// start starts a coordinator (the next one: c1, c2...) and has every live
// node join it.
func (e *memEnv) start() *memCoord {
	e.t.Helper()
	e.n++
	name := fmt.Sprintf("c%d", e.n)
	cat, err := catalog.Open(e.ctx, catalog.Config{Endpoints: e.etcd.Endpoints()})
	if err != nil {
		e.t.Fatal(err)
	}
	opts := e.opts
	if opts.NodeTTL == 0 {
		opts.NodeTTL = memTTL
	}
	opts.Dial = func(n coordv1.Node, term agentv1.Term) coord.Agent {
		var a coord.Agent = e.mc.Client(name, n.Name).WithTerm(term)
		if e.wrap != nil {
			a = e.wrap(n.Name, a)
		}
		return a
	}
	opts.Trace = func(job, step string) { e.note(name, step) }
	log := slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})).With("coordinator", name)
	co := coord.New(cat, nil, log, opts)
	ctx, cancel := context.WithCancel(e.ctx)
	mc := &memCoord{Coordinator: co, name: name, cat: cat, ctx: ctx, cancel: cancel}
	mc.wait = co.Start(ctx)
	if err := e.mc.Join(e.ctx, co, opts.NodeTTL/4); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { e.kill(mc) })
	return mc
}

// kill makes a coordinator die: agents refuse its calls, its catalog
// client is closed, its work ends.
func (e *memEnv) kill(mc *memCoord) {
	if mc.dead {
		return
	}
	mc.dead = true
	e.mc.Cut(mc.name)
	mc.cat.Close()
	mc.cancel()
	mc.wait()
}

// killAfter makes a coordinator die once n more of its calls to agents
// have been carried out (the nth one's reply is lost with it).
func (e *memEnv) killAfter(mc *memCoord, n int) {
	e.mc.CutAfter(mc.name, n, func() { mc.cat.Close(); mc.cancel() })
}

// takeTrace returns the trace since the last call: the coordinators'
// recorded phases and failpoints in order, and between two of them the
// calls agents carried out, sorted (their order is the network's).
func (e *memEnv) takeTrace() []string {
	e.mu.Lock()
	lines := e.trace
	e.trace = nil
	e.mu.Unlock()
	var out, calls []string
	flush := func() {
		slices.Sort(calls)
		for _, c := range calls {
			out = append(out, "  "+c)
		}
		calls = nil
	}
	for _, l := range lines {
		_, rest, _ := strings.Cut(l, " ")
		op, _, _ := strings.Cut(rest, " ")
		switch op {
		case "persist", "persist-decision", "persist-state", "failpoint":
			flush()
			out = append(out, l)
		default:
			calls = append(calls, l)
		}
	}
	flush()
	return out
}

// golden compares a trace with testdata/traces/NAME.txt (-rewrite writes
// it).
func golden(t *testing.T, name string, trace []string) {
	t.Helper()
	file := filepath.Join("testdata", "traces", name+".txt")
	got := strings.Join(trace, "\n") + "\n"
	if *rewrite {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run with -rewrite to make it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("trace %s (-want +got); run with -rewrite to accept:\n%s", file, diff)
	}
}

// runJob starts a job of ranks ranks of the ring program (no program
// runs: the agents are models) with k replicas.
func (mc *memCoord) runJob(t *testing.T, name string, ranks, k int, nodes ...string) *coordv1.Job {
	t.Helper()
	j, err := mc.RunJob(context.Background(), coordv1.RunJob{Name: name, Ranks: ranks, Replicas: k, Args: []string{"/bin/ring"}, Nodes: nodes})
	if err != nil {
		t.Fatalf("run %s: %v", name, err)
	}
	return j
}

// checkpoint takes a global checkpoint and waits until it is protected
// (replicated k times) if k > 0.
func (mc *memCoord) checkpoint(t *testing.T, job string, k int) int {
	t.Helper()
	ck, err := mc.Checkpoint(context.Background(), job, coordv1.CheckpointJob{})
	if err != nil {
		t.Fatalf("checkpoint %s: %v", job, err)
	}
	if k > 0 {
		waitFor(t, 10*time.Second, fmt.Sprintf("checkpoint %s:%d protected", job, ck.Seq), func() bool {
			cks, err := mc.Checkpoints(context.Background(), job)
			return err == nil && cks[len(cks)-1].State == coordv1.CkptProtected
		})
	}
	return ck.Seq
}

// waitFor polls cond until it holds, or fails the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settled waits until job is neither starting nor restarting and no
// migration of it runs, and returns its record.
func (e *memEnv) settled(mc *memCoord, job string, d time.Duration) *coordv1.Job {
	e.t.Helper()
	var j *coordv1.Job
	waitFor(e.t, d, "job "+job+" settled", func() bool {
		jobs, err := mc.Jobs(context.Background())
		if err != nil {
			return false
		}
		j = nil
		for i := range jobs {
			if jobs[i].Name == job {
				j = &jobs[i]
			}
		}
		if j == nil || j.State == coordv1.JobStarting || j.State == coordv1.JobRestarting {
			return j == nil
		}
		ms, err := mc.Migrations(context.Background(), job)
		if err != nil {
			return false
		}
		for _, m := range ms {
			if m.State == coordv1.MigrationRunning {
				return false
			}
		}
		return true
	})
	return j
}

// consistent checks that what the nodes hold of a running job is what its
// record says: every rank has exactly one container, on its node, running
// (not frozen, not locked, not held), restored from restoredFrom if that
// is not 0; every node of the job has its network, pointed at the
// placement.
func (e *memEnv) consistent(j *coordv1.Job, restoredFrom int) error {
	if j.State != coordv1.JobRunning {
		return fmt.Errorf("job %s is %s (%s)", j.Name, j.State, j.Reason)
	}
	ranks := e.mc.Ranks(j.Name)
	var errs []string
	for r, node := range j.Placement {
		vs := ranks[r]
		if len(vs) != 1 {
			errs = append(errs, fmt.Sprintf("rank %d has %d containers", r, len(vs)))
			continue
		}
		v := vs[0]
		switch {
		case v.Node != node:
			errs = append(errs, fmt.Sprintf("rank %d runs on %s, placed on %s", r, v.Node, node))
		case v.Status != agentv1.StatusRunning || v.Locked || v.Held:
			errs = append(errs, fmt.Sprintf("rank %d on %s is %s locked=%v held=%v", r, v.Node, v.Status, v.Locked, v.Held))
		case restoredFrom != 0 && v.RestoredFrom != restoredFrom:
			errs = append(errs, fmt.Sprintf("rank %d on %s restored from %d, want %d", r, v.Node, v.RestoredFrom, restoredFrom))
		}
	}
	for r := range ranks {
		if r >= len(j.Placement) {
			errs = append(errs, fmt.Sprintf("rank %d is not in the job", r))
		}
	}
	nets := e.mc.JobNets(j.VNI)
	for _, node := range j.Placement {
		jn, ok := nets[node]
		if !ok {
			errs = append(errs, fmt.Sprintf("node %s has no job network", node))
			continue
		}
		for r, on := range j.Placement {
			want := ""
			if on != node {
				want = e.mc.Node(on).Underlay()
			}
			if jn.Remotes[j.Addrs[r]] != want {
				errs = append(errs, fmt.Sprintf("node %s sends rank %d (%s) to %q, want %q", node, r, j.Addrs[r], jn.Remotes[j.Addrs[r]], want))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("job %s placed on %v:\n  %s\nthe nodes hold:\n%s", j.Name, j.Placement, strings.Join(errs, "\n  "), e.mc.Describe(j.Name))
	}
	return nil
}
