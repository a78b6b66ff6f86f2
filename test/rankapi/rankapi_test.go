package rankapi

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// The rank API end to end (docs/rank-api.md): programs in C and Python
// ask for a checkpoint of their own job from inside its ranks, ranks are
// told before checkpoints and after restores, and application-level jobs
// are checkpointed with no CRIU at all.

// sharedDir makes a directory on the root file system, which ranks (whose
// lower layer is the host's /) see at the same path.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "cairn-rankapi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// exampleDir is examples/rank-api.
func exampleDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../examples/rank-api")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

var finalRE = regexp.MustCompile(`rank (\d+): FINAL steps=\d+ checksum=([0-9a-f]+)`)

// finals maps each rank's FINAL checksum in out.
func finals(out string) map[int]string {
	m := map[int]string{}
	for _, f := range finalRE.FindAllStringSubmatch(out, -1) {
		r, _ := strconv.Atoi(f[1])
		m[r] = f[2]
	}
	return m
}

// alone runs a rank's program outside cairn, as rank r, and returns its
// FINAL checksum: what the rank must end with whatever happens to it.
func alone(t *testing.T, r int, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], append(argv[1:], "--rank", strconv.Itoa(r), "--sleep-ms", "0")...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v alone: %v\n%s", argv, err, out)
	}
	f := finals(string(out))
	if f[r] == "" {
		t.Fatalf("%v alone printed no FINAL for rank %d:\n%s", argv, r, out)
	}
	return f[r]
}

// waitLog waits for re in a rank's output and returns its submatches.
func waitLog(t *testing.T, c *testutil.Cluster, job string, rank int, re *regexp.Regexp, within time.Duration) []string {
	t.Helper()
	var m []string
	testutil.WaitUntil(t, within, func() (bool, string) {
		m = re.FindStringSubmatch(c.Logs(job, rank))
		return m != nil, fmt.Sprintf("rank %d of %s never printed %q:\n%s", rank, job, re, c.Logs(job, rank))
	})
	return m
}

// TestRankAsksForCheckpoint: a C program and a Python program, each a job
// of three ranks on three nodes, ask from inside rank 0 for a checkpoint of
// their own job (refused for another job), are killed after it, restart
// from it on other nodes and finish exactly: every rank's checksum is what
// the program computes alone, and rank 0's checkpoint call returned again
// in the restored rank, saying so.
func TestRankAsksForCheckpoint(t *testing.T) {
	c := testutil.NewCluster(t, 3)
	dir := sharedDir(t)
	src := exampleDir(t)
	bin := filepath.Join(dir, "ckpt")
	if out, err := exec.Command("cc", "-O2", "-I/opt/cairn/include", "-o", bin, filepath.Join(src, "ckpt.c"),
		"-L/opt/cairn/lib", "-lcairn", "-pthread", "-Wl,-rpath,/opt/cairn/lib").CombinedOutput(); err != nil {
		t.Fatalf("build ckpt.c: %v\n%s", err, out)
	}
	const steps, at = 1200, 300
	args := []string{"--steps", fmt.Sprint(steps), "--checkpoint-at", fmt.Sprint(at), "--every", "100"}
	for _, prog := range []struct {
		job  string
		argv []string
	}{
		{"ckc", []string{bin}},
		{"ckpy", []string{"/usr/bin/python3", filepath.Join(src, "ckpt.py")}},
	} {
		t.Run(prog.job, func(t *testing.T) {
			want := map[int]string{}
			for r := range 3 {
				want[r] = alone(t, r, append(prog.argv, args...)...)
			}
			run := append([]string{"run", "--job", prog.job, "--ranks", "3", "--per-node", "1", "--env", "PYTHONPATH=/opt/cairn/python", "--"}, prog.argv...)
			c.OK(append(run, append(args, "--sleep-ms", "20", "--try-job", "other")...)...)
			place := c.Status(prog.job).Placement
			// Refused as forbidden (the C client prints its strerror, the
			// Python one the agent's code), not for any other reason.
			refused := waitLog(t, c, prog.job, 0, regexp.MustCompile(`checkpoint of job other (refused|accepted)(: (\w+))?[^\n]*`), 60*time.Second)
			if refused[1] != "refused" || refused[3] != "forbidden" {
				t.Fatalf("rank 0's checkpoint of another job: %q, want it refused as forbidden", refused[0])
			}
			m := waitLog(t, c, prog.job, 0, regexp.MustCompile(`rank 0: checkpoint (\d+) done at step `+fmt.Sprint(at)), 60*time.Second)
			if m[1] != "1" {
				t.Fatalf("rank 0's checkpoint: %s", m[0])
			}
			cks := c.Ckpts(prog.job)
			if len(cks) != 1 || !cks[0].Restorable() || len(cks[0].Ranks) != 3 {
				t.Fatalf("checkpoints after the rank asked: %+v", cks)
			}
			// Killed, then restarted from it, every rank on another node.
			c.OK("kill", prog.job)
			moved := append(slices.Clone(place[1:]), place[0])
			c.OK("restart", prog.job, "--from", "1", "--placement", strings.Join(moved, ","))
			waitLog(t, c, prog.job, 0, regexp.MustCompile(`rank 0: restored from checkpoint 1, at step `+fmt.Sprint(at)), 60*time.Second)
			got := map[int]string{}
			for r := range 3 {
				got[r] = waitLog(t, c, prog.job, r, finalRE, 3*time.Minute)[2]
			}
			for r := range 3 {
				if got[r] != want[r] {
					t.Errorf("rank %d ended with %s, want %s (what it computes alone)", r, got[r], want[r])
				}
			}
			// Restored, not started again: the restored incarnation's
			// output begins with the checkpoint's, and no rank started
			// twice after it.
			for r := range 3 {
				out := c.Logs(prog.job, r)
				if n := strings.Count(out, fmt.Sprintf("rank %d of 3, job %s", r, prog.job)); n != 1 {
					t.Errorf("rank %d started %d times in its output:\n%s", r, n, out)
				}
			}
			var jobs []struct {
				Name         string `json:"name"`
				RestoredFrom int    `json:"restored_from"`
				Placement    []string
			}
			if err := json.Unmarshal([]byte(c.OK("jobs", "--json")), &jobs); err != nil {
				t.Fatal(err)
			}
			for _, j := range jobs {
				if j.Name == prog.job && (j.RestoredFrom != 1 || !slices.Equal(j.Placement, moved)) {
					t.Errorf("job %s restored from %d onto %v, want 1 onto %v", j.Name, j.RestoredFrom, j.Placement, moved)
				}
			}
			c.OK("rm", "-f", prog.job)
		})
	}
}

// watchServer is a node-local service on every node of a cluster: each
// node's listener, on port, checks the numbered lines of examples/rank-api
// /watch.py's clients, wherever they run.
type watchServer struct {
	mu       sync.Mutex
	want     map[int]int // rank -> number expected next
	rewinds  map[int]int // rank -> restores seen (a hello below what was expected)
	hellos   map[int]int
	done     map[int]bool
	errors   []string
	lns      []net.Listener
	lastFrom map[int]string // rank -> the node its last connection came in on
}

func startWatchServer(t *testing.T, c *testutil.Cluster, port int) *watchServer {
	t.Helper()
	s := &watchServer{want: map[int]int{}, rewinds: map[int]int{}, hellos: map[int]int{}, done: map[int]bool{}, lastFrom: map[int]string{}}
	for _, node := range c.Nodes {
		var ln net.Listener
		if err := netw.InNetns(netw.NetnsPath(node), func() (err error) {
			ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		s.lns = append(s.lns, ln)
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				go s.serve(conn, node)
			}
		}()
	}
	return s
}

func (s *watchServer) fail(format string, args ...any) {
	s.errors = append(s.errors, fmt.Sprintf(format, args...))
}

func (s *watchServer) serve(conn net.Conn, node string) {
	defer conn.Close()
	sc := bufio.NewScanner(conn)
	rank := -1
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		s.mu.Lock()
		switch {
		case len(w) == 3 && w[0] == "hello":
			rank, _ = strconv.Atoi(w[1])
			n, _ := strconv.Atoi(w[2])
			s.hellos[rank]++
			s.lastFrom[rank] = node
			want := s.want[rank]
			if want == 0 {
				want = 1
			}
			if n > want {
				s.fail("rank %d came back at %d: %d..%d lost", rank, n, want, n-1)
			} else if n < want {
				s.rewinds[rank]++
			}
			s.want[rank] = n
		case len(w) == 3 && w[0] == "bye" && rank >= 0:
			n, _ := strconv.Atoi(w[2])
			if s.want[rank] != n+1 {
				s.fail("rank %d ends at %d after %d", rank, n, s.want[rank]-1)
			}
			s.done[rank] = true
		case len(w) == 2 && rank >= 0:
			n, _ := strconv.Atoi(w[1])
			if n != s.want[rank] {
				s.fail("rank %d sent %d, want %d", rank, n, s.want[rank])
			} else {
				s.want[rank] = n + 1
			}
		}
		s.mu.Unlock()
	}
}

// TestRankCallbacks: ranks holding a TCP connection to a service outside
// their job (on their node) close it when told a checkpoint comes, reopen
// it when they run on, and, restored on other nodes, reopen it there; the
// service sees every rank's numbers in order, rewound to the checkpoint
// after the restore, and the job finishes. A rank that does not answer its
// callback in time makes the round abort, and the job runs on.
func TestRankCallbacks(t *testing.T) {
	const port = 7345
	t.Setenv("CAIRN_ALLOW_HOST_PORTS", strconv.Itoa(port)) // the agents let ranks reach their node's port
	c := testutil.NewCluster(t, 3)
	srv := startWatchServer(t, c, port)
	watch := filepath.Join(exampleDir(t), "watch.py")
	c.OK("run", "--job", "w", "--ranks", "2", "--nodes", c.Nodes[0]+","+c.Nodes[1], "--per-node", "1",
		"--env", "WATCH_SERVER=gateway:"+strconv.Itoa(port), "--", "/usr/bin/python3", watch, "--steps", "2400", "--sleep-ms", "25")
	place := c.Status("w").Placement
	for r := range 2 {
		waitLog(t, c, "w", r, regexp.MustCompile(fmt.Sprintf(`rank %d: sent 100`, r)), 60*time.Second)
	}
	c.OK("checkpoint", "w")
	for r := range 2 {
		waitLog(t, c, "w", r, regexp.MustCompile(fmt.Sprintf(`rank %d: closed the connection for checkpoint 1`, r)), 30*time.Second)
		waitLog(t, c, "w", r, regexp.MustCompile(fmt.Sprintf(`rank %d: reconnected, running on \(newest checkpoint 1\)`, r)), 30*time.Second)
	}
	// Killed, restarted from the checkpoint with rank 1 on the third node:
	// it reconnects to that node's service.
	c.OK("kill", "w")
	moved := []string{place[0], c.Nodes[2]}
	c.OK("restart", "w", "--from", "1", "--placement", strings.Join(moved, ","))
	for r := range 2 {
		waitLog(t, c, "w", r, regexp.MustCompile(fmt.Sprintf(`rank %d: reconnected, restored from checkpoint 1`, r)), 60*time.Second)
		waitLog(t, c, "w", r, regexp.MustCompile(fmt.Sprintf(`rank %d: done, 2400 messages`, r)), 3*time.Minute)
	}
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.done[0] && srv.done[1], fmt.Sprintf("the service saw ranks done: %v", srv.done)
	})
	srv.mu.Lock()
	for r := range 2 {
		// First connection, after the checkpoint, after the restore.
		if srv.hellos[r] < 3 || srv.rewinds[r] != 1 {
			srv.fail("rank %d: %d connections, %d rewinds; want 3 or more, and 1", r, srv.hellos[r], srv.rewinds[r])
		}
	}
	if srv.lastFrom[1] != c.Nodes[2] {
		srv.fail("restored rank 1 came in on %s, want %s (its new node)", srv.lastFrom[1], c.Nodes[2])
	}
	errs := srv.errors
	srv.mu.Unlock()
	if len(errs) > 0 {
		t.Fatalf("the service: %s", strings.Join(errs, "; "))
	}

	// A rank whose prepare callback takes longer than it allowed: the
	// round is aborted, and the job runs on.
	slow := filepath.Join(sharedDir(t), "slow.py")
	if err := os.WriteFile(slow, []byte(`import sys, time
sys.path.append("/opt/cairn/python")
import cairn
cairn.watch(prepare=lambda ckpt, mode: time.sleep(30), deadline_ms=1000)
for i in range(1, 100000):
    print("tick", i, flush=True)
    time.sleep(0.05)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	c.OK("run", "--job", "slow", "--ranks", "2", "--", "/usr/bin/python3", slow)
	waitLog(t, c, "slow", 1, regexp.MustCompile(`tick 20\n`), 60*time.Second)
	out, err := c.Run("checkpoint", "slow")
	if err == nil || !strings.Contains(out, "did not answer its checkpoint callback") {
		t.Fatalf("checkpoint of a job whose rank does not answer in time: %v\n%s", err, out)
	}
	cks := c.Ckpts("slow")
	if len(cks) != 1 || cks[0].State != "aborted" {
		t.Fatalf("checkpoints: %+v", cks)
	}
	ticks := regexp.MustCompile(`tick (\d+)\n`)
	last := func() int {
		m := ticks.FindAllStringSubmatch(c.Logs("slow", 0), -1)
		n, _ := strconv.Atoi(m[len(m)-1][1])
		return n
	}
	before := last()
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		return last() > before+10, "the job does not run on after the aborted round"
	})
}

// TestAppLevelCheckpoints: a job in application-level mode, whose ranks
// save their own state when told (examples/rank-api/appmode.py), is
// checkpointed twice, killed, and restarted from the newest checkpoint on
// other nodes: every rank starts afresh on its restored files
// (CAIRN_RESTART) and reads its state back; then one rank migrates, saving
// its state and starting afresh from it on its new node while the others
// run on; every rank ends exactly as alone. CRIU is
// never run: every node's CRIU is a stand-in that answers --version and
// check as CRIU 4.2 does and fails anything else, writing it down; nothing
// is written, and the checkpoints record no CRIU time.
func TestAppLevelCheckpoints(t *testing.T) {
	dir := sharedDir(t)
	calls, fake := filepath.Join(dir, "criu-calls"), filepath.Join(dir, "criu")
	if err := os.WriteFile(fake, []byte(`#!/bin/sh
case "$1" in
--version) echo "Version: 4.2.1"; exit 0 ;;
check) exit 0 ;;
esac
echo "$@" >> `+calls+`
exit 1
`), 0o755); err != nil {
		t.Fatal(err)
	}
	c := testutil.NewCluster(t, 3, "--criu", fake)
	c.WaitNodes(3, time.Minute)
	app := filepath.Join(exampleDir(t), "appmode.py")
	const steps = 1500
	want := map[int]string{}
	for r := range 3 {
		want[r] = alone(t, r, "/usr/bin/python3", app, "--steps", fmt.Sprint(steps), "--dir", t.TempDir())
	}
	c.OK("run", "--job", "app", "--ranks", "3", "--per-node", "1", "--mode", "app", "--",
		"/usr/bin/python3", app, "--steps", fmt.Sprint(steps), "--every", "100", "--sleep-ms", "20")
	place := c.Status("app").Placement
	saved := map[int]string{} // the step each rank saved for checkpoint 2
	for i := 1; i <= 2; i++ {
		waitLog(t, c, "app", 0, regexp.MustCompile(fmt.Sprintf(`rank 0: steps \d+-%d done`, 200*i)), 60*time.Second)
		c.OK("checkpoint", "app")
		for r := range 3 {
			saved[r] = waitLog(t, c, "app", r, regexp.MustCompile(fmt.Sprintf(`rank %d: saved step (\d+) for checkpoint %d\n`, r, i)), 30*time.Second)[1]
		}
	}
	c.OK("kill", "app")
	moved := append(slices.Clone(place[1:]), place[0])
	c.OK("restart", "app", "--placement", strings.Join(moved, ","))
	for r := range 3 {
		// Each rank goes on from exactly the step it saved.
		waitLog(t, c, "app", r, regexp.MustCompile(fmt.Sprintf(`rank %d: restarted from checkpoint 2, at step %s\n`, r, saved[r])), 60*time.Second)
	}
	// A migration of one rank: it saves its state when told, and its
	// command starts afresh from that state on the target, while the
	// other ranks run on.
	m := c.Migrate("app/1", "--to", moved[2])
	if m.State != "done" {
		t.Fatalf("migration of app/1: %s (%s)", m.State, m.Reason)
	}
	step := waitLog(t, c, "app", 1, regexp.MustCompile(fmt.Sprintf(`rank 1: saved step (\d+) for checkpoint %d\n`, m.Seq)), 30*time.Second)[1]
	waitLog(t, c, "app", 1, regexp.MustCompile(fmt.Sprintf(`rank 1: restarted from checkpoint %d, at step %s\n`, m.Seq, step)), 60*time.Second)
	if p := c.Status("app").Placement; p[1] != moved[2] {
		t.Errorf("rank 1 is placed on %s after its migration to %s", p[1], moved[2])
	}
	for r := range 3 {
		if r == 1 {
			continue
		}
		if n := len(regexp.MustCompile(`restarted from checkpoint`).FindAllString(c.Logs("app", r), -1)); n != 1 {
			t.Errorf("rank %d started afresh %d times, want once (the restart): it should run on through rank 1's migration", r, n)
		}
	}
	for r := range 3 {
		if got := waitLog(t, c, "app", r, finalRE, 3*time.Minute)[2]; got != want[r] {
			t.Errorf("rank %d ended with %s, want %s (what it computes alone)", r, got, want[r])
		}
	}
	if b, err := os.ReadFile(calls); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CRIU was run for an application-level job: %v\n%s", err, b)
	}
	var cks []struct {
		Seq   int    `json:"seq"`
		State string `json:"state"`
		Ranks []struct {
			CRIU int64 `json:"criu_ns"`
		} `json:"ranks"`
	}
	if err := json.Unmarshal([]byte(c.OK("checkpoints", "app", "--json")), &cks); err != nil {
		t.Fatal(err)
	}
	if len(cks) != 2 {
		t.Fatalf("%d checkpoints, want 2", len(cks))
	}
	for _, ck := range cks {
		for r, rk := range ck.Ranks {
			if rk.CRIU != 0 {
				t.Errorf("checkpoint %d: rank %d's dump took %s of CRIU", ck.Seq, r, time.Duration(rk.CRIU))
			}
		}
	}
}
