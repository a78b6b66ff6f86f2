package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/chaos"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testbed"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

var (
	long = flag.Bool("long", false, "TestChaos: the long run of make chaos, with enough failures to hold the measured ETTR to the model's within 5 points")
	// report is where -long writes the run's table: docs/planning.md,
	// between its markers.
	report = flag.String("chaos-report", "", "TestChaos -long: write the run's table into this file between its markers")
)

// A run of the test.
type run struct {
	nodes, ranks int
	replicas     int
	messages     int
	mtbf, repair time.Duration
	ttl          time.Duration // the cluster's node TTL
	seed         int
	within       time.Duration // for cairn chaos to end
	minHits      int           // failures of the job's nodes the run must see
	tolerance    float64       // |measured − predicted ETTR| at most
}

// short is the run of make test, two minutes or so: 5 nodes, the ring
// job's 2 ranks on two of them, each node failing at a mean of 120 s (the
// job's MTBF 60 s) and back 30 s later. Seed 49 fails n2, where rank 1
// starts, 11 s into the window, then n1, where rank 0 runs, at 57 s: the
// job restarts at least once. The tolerance is loose: a few failures
// tell the model little, and the test holds the run's working, not the
// model (the long run does).
//
// Both runs give the cluster a node TTL of 10 s (4 by default): on a
// machine loaded by other tests, heartbeats come seconds late, and a live
// node found dead interrupts the job besides the failures the test makes
// (docs/planning.md). A node comes back 30 s after it fails, after the
// coordinator's next restart attempt (a node TTL after one fails).
var short = run{nodes: 5, ranks: 2, replicas: 1, messages: 4_000_000, mtbf: 2 * time.Minute, repair: 30 * time.Second,
	ttl: 10 * time.Second, seed: 49, within: 15 * time.Minute, minHits: 1, tolerance: 0.25}

// longRun is make chaos's: a node's MTBF of 120 s (the job's 60 s), the
// job sized from the ring job's rate here for about 10 minutes of work
// without failures, which makes 15 minutes or so with them and about 15
// failures of the job's nodes: at least 10 are required. Two replicas:
// with one, a rank's node and its copy's holder failing a few seconds
// apart send the restart further back than the model's last checkpoint
// (docs/planning.md).
var longRun = run{nodes: 5, ranks: 2, replicas: 2, mtbf: 120 * time.Second, repair: 30 * time.Second,
	ttl: 10 * time.Second, seed: 1, within: 80 * time.Minute, minHits: 10, tolerance: 0.05}

// TestChaos runs cairn chaos on a local cluster and checks what it says
// against the cluster: the job's result exactly the one computed without
// any network (read from its rank 0's log here too), restarts the
// coordinator made, every failure found by the coordinator and every node
// back and alive at the end; then the ETTR figures for coherence (a
// restart takes longer than the node TTL it waits for, checkpoints cost
// less than their interval) and the measured ETTR against the model's.
func TestChaos(t *testing.T) {
	p := short
	if *long {
		p = longRun
	}
	c := testutil.NewCluster(t, p.nodes, "--node-ttl", p.ttl.String())
	if *long {
		rate := ringRate(t, c, p.ranks)
		p.messages = int(rate * 10 * 60)
		t.Logf("the ring job of %d ranks handles %.0f messages/s here: %d messages", p.ranks, rate, p.messages)
	}
	out := chaosRun(t, c, p.within, "--json", "--keep", "--ranks", strconv.Itoa(p.ranks), "--replicas", strconv.Itoa(p.replicas), "--messages", strconv.Itoa(p.messages),
		"--mtbf", p.mtbf.String(), "--repair", p.repair.String(), "--seed", strconv.Itoa(p.seed))
	var res chaos.Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("cairn chaos --json: %v\n%s", err, out)
	}
	m := res.Measurement
	if err := res.WriteText(t.Output()); err != nil {
		t.Fatal(err)
	}

	// The result: exactly the uninterrupted run's, as chaos says and as
	// rank 0's log says.
	want := ringapp.Expected(p.ranks, p.messages, ringapp.DefaultWindow, 1)
	if !res.Exact || res.Output != want || res.Expected != want {
		t.Errorf("result %q (exact %v, expected %q), want %s", res.Output, res.Exact, res.Expected, want)
	}
	if log := c.OK("logs", "chaos/0"); !strings.Contains(log, "result="+want+"\n") {
		t.Errorf("rank 0's log has no result=%s:\n%s", want, tail(log, 10))
	}
	j := c.Job("chaos")
	if j.State != string(coordv1.JobExited) || j.Restarts != len(res.Restarts) || j.Restarts < 1 {
		t.Errorf("job %s after %d restarts (%s); chaos saw %d restarts, want one or more", j.State, j.Restarts, j.Reason, len(res.Restarts))
	}
	c.OK("rm", "-f", "chaos")

	// The failures: each node failed was back before it failed again,
	// found dead by the coordinator in between, and is alive now.
	fails, lost := map[string]int{}, map[string]int{}
	down := map[string]bool{}
	for _, f := range res.Faults {
		switch f.Kind {
		case chaos.Fail:
			if down[f.Node] {
				t.Errorf("%s failed at %s while down", f.Node, f.Time.Format(time.TimeOnly))
			}
			fails[f.Node]++
			down[f.Node] = true
		case chaos.Repair:
			if !down[f.Node] {
				t.Errorf("%s came back at %s while up", f.Node, f.Time.Format(time.TimeOnly))
			}
			down[f.Node] = false
		}
	}
	for n, d := range down {
		if d {
			t.Errorf("%s was left down", n)
		}
	}
	for _, e := range events(t, c, evv1.NodeLost) {
		lost[e.Node]++
	}
	total := 0
	for n, k := range fails {
		total += k
		if lost[n] < k {
			t.Errorf("%s failed %d times, the coordinator found it dead %d times", n, k, lost[n])
		}
	}
	if total != m.Failures || m.Hits < p.minHits || m.Hits > m.Failures {
		t.Errorf("%d failures injected, %d measured, %d of the job's nodes: want them equal and %d or more of the job's", total, m.Failures, m.Hits, p.minHits)
	}
	checkNodesBack(t, c)

	// The figures.
	if m.ETTR <= 0 || m.ETTR > 1 || m.Predicted <= 0 || m.Predicted >= 1 {
		t.Errorf("ETTR measured %.3f, predicted %.3f: want both in (0, 1)", m.ETTR, m.Predicted)
	}
	// A node's lease runs a TTL from its last heartbeat (every TTL/4),
	// which may have come up to a heartbeat before it failed: it is found
	// dead from 3/4 of a TTL after the failure on (a run failed on R 9.58 s
	// against the whole TTL).
	if found := p.ttl * 3 / 4; m.RestartsTimed < 1 || m.Restart <= found.Seconds() {
		t.Errorf("R %.2fs over %d restarts: a restart cannot end before the node's lease (TTL %s, less a heartbeat) has expired", m.Restart, m.RestartsTimed, p.ttl)
	}
	if m.Rounds < 3 || m.Cost <= 0 || m.Cost >= m.Interval {
		t.Errorf("C %.3fs over %d rounds, τ+C %.3fs", m.Cost, m.Rounds, m.Interval)
	}
	if wall := res.To.Sub(res.From).Seconds(); math.Abs(wall-m.Wall) > 1e-3 || m.Work <= 0 || m.Work > float64(p.messages) {
		t.Errorf("window %.1fs (from %s to %s), measured %.1fs; %.0f messages of %d", wall, res.From, res.To, m.Wall, m.Work, p.messages)
	}
	if d := m.ETTR - m.Predicted; math.Abs(d) > p.tolerance {
		t.Errorf("measured ETTR %.3f is %+.1f points from the model's %.3f (want within %.0f)", m.ETTR, 100*d, m.Predicted, 100*p.tolerance)
	}
	if *report != "" {
		if err := writeReport(*report, res); err != nil {
			t.Errorf("chaos report: %v", err)
		}
	}
}

// TestChaosInterrupted: a run stopped (Ctrl-C) while nodes are down
// brings them back before it exits (130, interrupted), and removes its
// job. Its nodes fail every 2 s on average and would stay down for 10
// minutes.
func TestChaosInterrupted(t *testing.T) {
	c := testutil.NewCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Bin, "--data", c.Data, "--staging", c.Staging, "chaos",
		"--mtbf", "2s", "--repair", "10m", "--messages", "100000000", "--seed", "1")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); pw.Close() }()
	failsRE := regexp.MustCompile(`\] (\S+) fails \(`)
	backRE := regexp.MustCompile(`\] (\S+) comes back$`)
	failed, back := map[string]bool{}, map[string]bool{}
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		line := sc.Text()
		t.Log(line)
		if m := failsRE.FindStringSubmatch(line); m != nil {
			if len(failed) == 0 {
				if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
					t.Fatal(err)
				}
			}
			failed[m[1]] = true
		}
		if m := backRE.FindStringSubmatch(line); m != nil {
			back[m[1]] = true
		}
	}
	err := <-done
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("cairn chaos interrupted: %v, want exit status 130", err)
	}
	if len(failed) == 0 {
		t.Fatal("no node failed before the interruption")
	}
	for n := range failed {
		if !back[n] {
			t.Errorf("%s failed and was not said back", n)
		}
	}
	checkNodesBack(t, c)
	var jobs []testutil.Job
	if err := json.Unmarshal([]byte(c.OK("jobs", "--json")), &jobs); err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 0 {
		t.Errorf("jobs left: %+v", jobs)
	}
}

// chaosRun runs cairn chaos with args, its progress in the test's log,
// and returns its standard output.
func chaosRun(t *testing.T, c *testutil.Cluster, within time.Duration, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Bin, append([]string{"--data", c.Data, "--staging", c.Staging, "chaos"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, t.Output()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) } // it brings its nodes back
	cmd.WaitDelay = 3 * time.Minute
	if err := cmd.Run(); err != nil {
		t.Fatalf("cairn chaos %s: %v\n%s", strings.Join(args, " "), err, out.Bytes())
	}
	return out.Bytes()
}

// checkNodesBack fails t unless the coordinator sees every node alive and
// every agent cluster.json records runs.
func checkNodesBack(t *testing.T, c *testutil.Cluster) {
	t.Helper()
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		var nodes []coordv1.Node
		if err := json.Unmarshal([]byte(c.OK("nodes", "--json")), &nodes); err != nil {
			return false, err.Error()
		}
		for _, n := range nodes {
			if !n.Alive {
				return false, fmt.Sprintf("node %s is dead", n.Name)
			}
		}
		return len(nodes) == len(c.Nodes), fmt.Sprintf("%d nodes, want %d", len(nodes), len(c.Nodes))
	})
	for _, n := range c.File().Nodes {
		if !testbed.Running(n.PID) {
			t.Errorf("the agent of %s (pid %d) does not run", n.Name, n.PID)
		}
	}
}

// events returns the cluster's events of a type.
func events(t *testing.T, c *testutil.Cluster, typ string) []evv1.Event {
	t.Helper()
	var out []evv1.Event
	sc := bufio.NewScanner(strings.NewReader(c.OK("events", "--type", typ, "--json")))
	for sc.Scan() {
		var e evv1.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("event %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

// ringRate measures how many messages a second the ring job of ranks
// ranks, one a node, handles on the cluster: over 20 s of its rank 0's
// progress reports, without checkpoints.
func ringRate(t *testing.T, c *testutil.Cluster, ranks int) float64 {
	t.Helper()
	c.OK(append([]string{"run", "--job", "rate", "--ranks", strconv.Itoa(ranks), "--per-node", "1"}, c.RingArgs(2_000_000_000)...)...)
	c.WaitProgress("rate", ranks, 0, 90*time.Second)
	time.Sleep(20 * time.Second)
	var first, last *evv1.Event
	for _, e := range events(t, c, evv1.RankEvent) {
		if e.Job == "rate" && e.Rank != nil && *e.Rank == 0 {
			if first == nil {
				first = &e
			}
			last = &e
		}
	}
	c.OK("rm", "-f", "rate")
	if first == nil || !last.Time.After(first.Time.Add(10*time.Second)) {
		t.Fatalf("the ring job reported no progress over 10 s (%v, %v)", first, last)
	}
	a, _ := strconv.ParseFloat(first.Message, 64)
	b, _ := strconv.ParseFloat(last.Message, 64)
	return (b - a) / last.Time.Sub(first.Time).Seconds()
}

// Markers of the generated part of docs/planning.md.
const (
	reportBegin = "<!-- chaos run: begin -->\n"
	reportEnd   = "<!-- chaos run: end -->\n"
)

// writeReport writes the run's table into path between the markers.
func writeReport(path string, res chaos.Result) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(old)
	i, k := strings.Index(s, reportBegin), strings.Index(s, reportEnd)
	if i < 0 || k < i {
		return fmt.Errorf("%s has no %q ... %q", path, strings.TrimSpace(reportBegin), strings.TrimSpace(reportEnd))
	}
	table := fmt.Sprintf("<!-- written by make chaos (TestChaos -long -chaos-report); do not edit -->\nLatest run: %s.\n\n%s",
		res.To.UTC().Format("2006-01-02"), res.Markdown())
	return os.WriteFile(path, []byte(s[:i+len(reportBegin)]+table+s[k:]), 0o644)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
