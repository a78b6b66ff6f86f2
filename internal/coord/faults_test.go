package coord_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

var (
	allFaults   = flag.Bool("faults", false, "TestFaultMatrix: every case of the matrix (make faults), not a sample")
	faultReport = flag.String("fault-report", "", "TestFaultMatrix: write the matrix's results as a markdown table to this file")
)

// A fault class of TestFaultMatrix: what goes wrong right after a
// protocol's nth call to an agent.
type faultClass struct {
	name string
	what string
	// inject makes the fault happen after call n of c, which has
	// carried out node.
	inject func(e *memEnv, c *memCoord, node string)
}

// partitionFor is how long a partitioned node stays cut off from the
// coordinator: longer than a node lease (memTTL), shorter than the holds.
const partitionFor = 3 * time.Second

var faultClasses = []faultClass{{
	name: "node",
	what: "the node that carried the call out dies with its data (fail-stop)",
	inject: func(e *memEnv, c *memCoord, node string) {
		e.mc.Kill(node)
	},
}, {
	name: "partition",
	what: "the node that carried the call out is cut off from the coordinator for " + partitionFor.String() + " (its reply lost), then heals",
	inject: func(e *memEnv, c *memCoord, node string) {
		e.mc.Partition(c.name, node)
		time.AfterFunc(partitionFor, func() { e.mc.Heal(c.name, node) })
	},
}}

// faultHold is the agents' hold in the matrix: what they keep frozen or
// held without a decision is theirs again after it.
const faultHold = 4 * time.Second

// TestFaultMatrix injects each fault class right after each call a
// protocol (job start, round, restart, migration) makes to an agent, on
// a real coordinator and etcd over in-memory agents, and checks the
// invariants once the job has settled (faultInvariants). The coordinator
// dying at each call is TestCoordinatorDiesAnywhere. make faults runs
// every case (-faults); make test a sample: the middle call of each
// protocol.
func TestFaultMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault matrix takes minutes: it runs without -short")
	}
	opts := coord.Options{Hold: faultHold, Deadline: 2 * time.Second}
	var mu sync.Mutex
	var results []faultResult
	for _, sc := range append(slices.Clone(scenarios), replicated...) {
		e := newMemEnv(t, sc.nodes, memagent.Options{Hold: faultHold}, opts)
		c := e.start()
		if sc.setup != nil {
			sc.setup(t, e, c)
		}
		before := e.mc.Calls(c.name)
		if err := sc.run(c.ctx, c); err != nil {
			t.Fatalf("%s: undisturbed run: %v", sc.name, err)
		}
		calls := e.mc.Calls(c.name) - before
		steps := sampleSteps(calls, *allFaults)
		for _, fc := range faultClasses {
			for _, n := range steps {
				name := fmt.Sprintf("%s/%s/%d", fc.name, sc.name, n)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					start := time.Now()
					res := faultResult{class: fc.name, scenario: sc.name, step: n, of: calls}
					defer func() {
						res.took, res.passed = time.Since(start), !t.Failed()
						mu.Lock()
						results = append(results, res)
						mu.Unlock()
					}()
					e := newMemEnv(t, sc.nodes, memagent.Options{Hold: faultHold}, opts)
					c := e.start()
					if sc.setup != nil {
						sc.setup(t, e, c)
					}
					var hit string
					e.mc.AfterCall(c.name, n, func(node string) {
						hit = node
						fc.inject(e, c, node)
					})
					err := sc.run(c.ctx, c)
					t.Logf("%s after call %d of %d (on %s): the protocol returned %v", fc.name, n, calls, hit, err)
					e.last = c
					res.outcome = faultInvariants(t, e, c, "ring")
					if sc.survives && res.outcome != string(coordv1.JobRunning) {
						t.Errorf("the job, with a protected checkpoint and spare nodes, ended %s", res.outcome)
					}
				})
			}
		}
	}
	t.Cleanup(func() {
		if *faultReport != "" {
			writeFaultReport(t, *faultReport, results)
		}
	})
}

// replicated are the matrix's protocols on a job with a replica of
// every image (k=1), a protected checkpoint and a spare node: a node lost
// at any step must end in an automatic restart, and the job running.
var replicated = []scenario{{
	name:  "checkpoint-k1",
	nodes: 4,
	setup: func(t *testing.T, e *memEnv, c *memCoord) {
		c.runJob(t, "ring", 3, 1, "n0", "n1", "n2")
		c.checkpoint(t, "ring", 1)
	},
	run: func(ctx context.Context, c *memCoord) error {
		_, err := c.Checkpoint(ctx, "ring", coordv1.CheckpointJob{})
		return err
	},
	survives: true,
}, {
	name:  "restart-k1",
	nodes: 5,
	setup: func(t *testing.T, e *memEnv, c *memCoord) {
		c.runJob(t, "ring", 3, 1, "n0", "n1", "n2")
		c.checkpoint(t, "ring", 1)
	},
	run: func(ctx context.Context, c *memCoord) error {
		_, err := c.Restart(ctx, "ring", coordv1.Restart{Placement: []string{"n1", "n2", "n3"}})
		return err
	},
	survives: true,
}, {
	name:  "migration-k1",
	nodes: 4,
	setup: func(t *testing.T, e *memEnv, c *memCoord) {
		c.runJob(t, "ring", 3, 1, "n0", "n1", "n2")
		c.checkpoint(t, "ring", 1)
	},
	run: func(ctx context.Context, c *memCoord) error {
		_, err := c.Migrate(ctx, "ring", coordv1.Migrate{Rank: 1, To: "n3"})
		return err
	},
	survives: true,
}}

// sampleSteps are the calls after which faults are injected: all of them,
// or the middle one.
func sampleSteps(calls int, all bool) []int {
	if !all {
		return []int{(calls + 1) / 2}
	}
	out := make([]int, calls)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// faultInvariants waits until the job has settled (its record unchanged
// for longer than a restart's retry and the agents' holds, nothing
// starting, restarting or migrating, no rank of it frozen, locked or
// held: agents release what they hold at the end of its hold, at most a
// minute and faultHold) and checks what must hold whatever failed:
//   - a running job is consistent: every rank exactly once, on its node,
//     running, not frozen, locked or held; every node's job network right;
//   - a job that is not running says why, and no rank of it runs, and none
//     is left frozen, locked or held on a live node;
//   - no rank runs twice anywhere;
//   - every copy a durable or protected checkpoint lists on a live node is
//     there (nothing torn listed durable); with replicas, a protected one
//     has a live copy of every rank image; a rank image no live node
//     holds is listed unavailable; no round is left preparing.
//
// It returns the job's final state, for the report.
func faultInvariants(t *testing.T, e *memEnv, c *memCoord, job string) string {
	t.Helper()
	ctx := context.Background()
	var last string
	stable := time.Time{}
	quiet := 2*memTTL + faultHold
	waitFor(t, 150*time.Second, "job "+job+" settled", func() bool {
		rec := jobRecord(e, c, job)
		if rec != last {
			last, stable = rec, time.Now()
			return false
		}
		return time.Since(stable) >= quiet && !strings.Contains(rec, `"state":"starting"`) && !strings.Contains(rec, `"state":"restarting"`) &&
			!strings.Contains(rec, "on a dead node")
	})
	jobs, err := c.Jobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var j *coordv1.Job
	for i := range jobs {
		if jobs[i].Name == job {
			j = &jobs[i]
		}
	}
	ranks := e.mc.Ranks(job)
	for r, vs := range ranks {
		running := 0
		for _, v := range vs {
			if v.Status == agentv1.StatusRunning {
				running++
			}
		}
		if running > 1 {
			t.Errorf("rank %d runs %d times:\n%s", r, running, e.mc.Describe(job))
		}
	}
	if j == nil {
		// What a node cut off from the undo started is stopped there once
		// it is heard again; its output is kept.
		for _, vs := range ranks {
			for _, v := range vs {
				if v.Status.Live() || v.Locked || v.Held {
					t.Errorf("the job's start was undone, but the nodes hold it live:\n%s", e.mc.Describe(job))
				}
			}
		}
		return "undone"
	}
	if j.State == coordv1.JobRunning {
		if err := e.consistent(j, 0); err != nil {
			t.Error(err)
		}
	} else {
		if j.Reason == "" {
			t.Errorf("job %s is %s, and does not say why", job, j.State)
		}
		// A node stops what it holds of a job that no longer runs when
		// its next heartbeat lists it: the job's record does not change
		// then, so allow the nodes a heartbeat beyond the settling.
		var live []string
		for deadline := time.Now().Add(memTTL); ; time.Sleep(50 * time.Millisecond) {
			live = nil
			for r, vs := range e.mc.Ranks(job) {
				for _, v := range vs {
					if v.Status == agentv1.StatusRunning || v.Status == agentv1.StatusPaused || v.Locked && v.Status != agentv1.StatusCheckpointed || v.Held {
						live = append(live, fmt.Sprintf("rank %d on %s is %s locked=%v held=%v", r, v.Node, v.Status, v.Locked, v.Held))
					}
				}
			}
			if len(live) == 0 || time.Now().After(deadline) {
				break
			}
		}
		for _, l := range live {
			t.Errorf("job %s is %s, but %s", job, j.State, l)
		}
	}
	cks, err := c.Checkpoints(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	alive := map[string]bool{}
	for _, n := range e.mc.Nodes() {
		alive[n] = e.mc.Node(n).Alive()
	}
	for _, ck := range cks {
		switch ck.State {
		case coordv1.CkptPreparing, coordv1.CkptCommitted:
			t.Errorf("checkpoint %d left %s", ck.Seq, ck.State)
		case coordv1.CkptDurable, coordv1.CkptProtected:
			for _, r := range ck.Ranks {
				name := agentv1.RankName(job, r.Rank)
				live := 0
				for _, n := range r.Copies {
					if !alive[n] {
						continue
					}
					live++
					if !e.mc.HasImage(n, name, ck.Seq) {
						t.Errorf("checkpoint %d lists a copy of rank %d on %s, which has none", ck.Seq, r.Rank, n)
					}
				}
				// A protected checkpoint survives any one fault; a durable
				// one whose node died before its replicas were made is
				// lost, and must be listed so.
				if live == 0 && ck.State == coordv1.CkptProtected && j.Replicas > 0 {
					t.Errorf("protected checkpoint %d has no live copy of rank %d (copies %v), with %d replicas", ck.Seq, r.Rank, r.Copies, j.Replicas)
				}
				if live == 0 && !slices.Contains(ck.Unavailable, r.Rank) {
					t.Errorf("checkpoint %d has no live copy of rank %d (copies %v), but is not listed unavailable (%v)", ck.Seq, r.Rank, r.Copies, ck.Unavailable)
				}
			}
		}
	}
	return string(j.State)
}

// jobRecord is the job's record and its migrations as JSON, to tell
// when it stops changing; with "on a dead node" if it runs with a rank on
// a dead node (its automatic restart is under way: failed attempts
// change no record).
func jobRecord(e *memEnv, c *memCoord, job string) string {
	ctx := context.Background()
	jobs, err := c.Jobs(ctx)
	if err != nil {
		return "error " + err.Error()
	}
	ms, _ := c.Migrations(ctx, job)
	for _, j := range jobs {
		if j.Name == job {
			b, _ := json.Marshal(struct {
				J  coordv1.Job
				Ms []coordv1.Migration
			}{j, ms})
			for _, m := range ms {
				if m.State == coordv1.MigrationRunning {
					return "migrating " + string(b) + time.Now().String() // never stable
				}
			}
			if j.State == coordv1.JobRunning && slices.ContainsFunc(j.Placement, func(n string) bool { return !e.mc.Node(n).Alive() }) {
				return "on a dead node " + string(b)
			}
			// What agents hold frozen or locked is theirs to release at
			// the end of its hold (a migration's is the coordinator's hold
			// and a minute): the invariants hold from then on.
			// A rank ended at a checkpoint (a stop round) stays locked
			// until it is removed: it is settled.
			for _, vs := range e.mc.Ranks(job) {
				for _, v := range vs {
					if v.Held || v.Locked && v.Status != agentv1.StatusCheckpointed || v.Status == agentv1.StatusPaused {
						return "frozen " + time.Now().String() // not settled yet
					}
				}
			}
			return string(b)
		}
	}
	return "gone"
}

// faultResult is one case of the matrix, for the report.
type faultResult struct {
	class, scenario string
	step, of        int
	outcome         string
	passed          bool
	took            time.Duration
}

// writeFaultReport writes the matrix's results as docs/reliability.md's
// table: a line per class and protocol.
func writeFaultReport(t *testing.T, path string, results []faultResult) {
	type row struct {
		cases, passed int
		outcomes      map[string]int
		took          time.Duration
	}
	rows := map[[2]string]*row{}
	var total time.Duration
	for _, r := range results {
		k := [2]string{r.class, r.scenario}
		if rows[k] == nil {
			rows[k] = &row{outcomes: map[string]int{}}
		}
		rw := rows[k]
		rw.cases++
		if r.passed {
			rw.passed++
		}
		rw.outcomes[r.outcome]++
		rw.took += r.took
		total += r.took
	}
	keys := make([][2]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool { return keys[a][0]+keys[a][1] < keys[b][0]+keys[b][1] })
	var b strings.Builder
	mode := "a sample (make test)"
	if *allFaults {
		mode = "every case (make faults)"
	}
	fmt.Fprintf(&b, "<!-- written by TestFaultMatrix -fault-report; do not edit -->\n")
	fmt.Fprintf(&b, "Latest run: %s, %s, %d cases, %s of case time (cases run in parallel).\n\n",
		time.Now().UTC().Format("2006-01-02"), mode, len(results), total.Round(time.Second))
	fmt.Fprintf(&b, "| fault | protocol | cases | passed | how the job ended | case time |\n|---|---|---|---|---|---|\n")
	for _, k := range keys {
		rw := rows[k]
		var outs []string
		for o, n := range rw.outcomes {
			outs = append(outs, fmt.Sprintf("%s %d", o, n))
		}
		sort.Strings(outs)
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %s | %s |\n", k[0], k[1], rw.cases, rw.passed, strings.Join(outs, ", "), rw.took.Round(time.Second))
	}
	if err := writeBetween(path, b.String()); err != nil {
		t.Errorf("fault report: %v", err)
	}
}

// Markers of the generated part of docs/reliability.md.
const (
	reportBegin = "<!-- fault matrix: begin -->\n"
	reportEnd   = "<!-- fault matrix: end -->\n"
)

// writeBetween replaces what lies between the report's markers in path.
func writeBetween(path, table string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(old)
	i, k := strings.Index(s, reportBegin), strings.Index(s, reportEnd)
	if i < 0 || k < i {
		return fmt.Errorf("%s has no %q ... %q", path, strings.TrimSpace(reportBegin), strings.TrimSpace(reportEnd))
	}
	s = s[:i+len(reportBegin)] + table + s[k:]
	return os.WriteFile(path, []byte(s), 0o644)
}
