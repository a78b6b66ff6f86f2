package table_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/plan"
	"github.com/cairn-hpc/cairn/internal/table"
)

func lines(s string) string { return strings.TrimRight(s, "\n") }

func TestJobs(t *testing.T) {
	var b strings.Builder
	jobs := []coordv1.Job{{RunJob: coordv1.RunJob{Name: "ring", Ranks: 4, Args: []string{"/usr/bin/a-rather-long-solver", "--with", "flags"}},
		Placement: []string{"n1", "n2", "n1", "n3"}, State: "running", LastCkpt: 3, Restarts: 1},
		{RunJob: coordv1.RunJob{Name: "bad", Ranks: 2, Args: []string{"./bad"}}, Placement: []string{"n1", "n2"},
			State: "failed", Reason: "rank 1 exited 7"}}
	if err := table.Jobs(&b, jobs); err != nil {
		t.Fatal(err)
	}
	want := `JOB   RANKS  STATE                     NODES     LAST CKPT  RESTARTS  CREATED  COMMAND
ring  4      running                   n1,n2,n3  3          1         -        /usr/bin/a-rather-long-solver…
bad   2      failed (rank 1 exited 7)  n1,n2     -          0         -        ./bad`
	if got := lines(b.String()); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestNodes(t *testing.T) {
	var b strings.Builder
	nodes := []coordv1.Node{
		{Name: "n1", Alive: true, Spare: true, Addr: "10.0.0.1:7420", Underlay: "10.0.0.1"},
		{Name: "n2", Drained: true, Ranks: 2, Health: []string{"disk: 1% free"}},
	}
	if err := table.Nodes(&b, nodes); err != nil {
		t.Fatal(err)
	}
	want := `NODE  STATE           RANKS  AGENT          UNDERLAY  JOINED  HEALTH
n1    alive (spare)   0      10.0.0.1:7420  10.0.0.1  -       ok
n2    dead (drained)  2                               -       disk: 1% free`
	if got := lines(b.String()); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestRanksAndPlacement(t *testing.T) {
	var b strings.Builder
	one := 1
	st := coordv1.JobStatus{RankStates: []coordv1.Rank{
		{Rank: 0, Node: "n1", Addr: "10.1.0.2", Status: "running", Pid: 42},
		{Rank: 1, Node: "n2", Addr: "10.1.0.3", Status: "exited", ExitCode: &one, Error: "oom"},
	}}
	if err := table.Ranks(&b, st); err != nil {
		t.Fatal(err)
	}
	table.Placement(&b, coordv1.Job{Addrs: []string{"10.1.0.2"}, Placement: []string{"n1"}})
	want := `RANK  NODE  ADDRESS   STATUS            PID
0     n1    10.1.0.2  running           42
1     n2    10.1.0.3  exited (1) (oom)  -
  rank 0  10.1.0.2        on n1`
	if got := lines(b.String()); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestEvent(t *testing.T) {
	rank := 2
	e := evv1.Event{Seq: 17, Time: time.Date(2025, 1, 2, 3, 4, 5, 6e6, time.Local), Type: "checkpoint.committed",
		Job: "ring", Rank: &rank, Ckpt: 3, Node: "n1", Duration: 1500 * time.Microsecond, Bytes: 3 << 20, Message: "done"}
	want := "    17  03:04:05.006  checkpoint.committed job=ring rank=2 ckpt=3 node=n1 took=2ms bytes=3.0 MiB  done"
	if got := table.Event(e); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestMigration(t *testing.T) {
	var b strings.Builder
	table.Migration(&b, coordv1.Migration{Job: "ring", Rank: 1, From: "n1", To: "n4", State: "failed",
		Stall: 1234 * time.Millisecond, Bytes: 2048, Reason: "target died"})
	want := "ring/1: n1 -> n4 failed (job stalled 1.234s: dump 0s, move 0s of 2.0 KiB, restore 0s, resume 0s)\n  target died\n"
	if b.String() != want {
		t.Errorf("got  %q\nwant %q", b.String(), want)
	}
}

func TestContainers(t *testing.T) {
	var b strings.Builder
	in := &container.Info{Name: "sim", Status: "exited", Exit: &container.Exit{Signal: "SIGKILL"}}
	in.Config.Args = []string{"sleep", "600"}
	in.Addr = netip.MustParseAddr("10.0.0.2")
	if err := table.Containers(&b, []*container.Info{in}); err != nil {
		t.Fatal(err)
	}
	want := `NAME  STATUS            PID  ADDRESS   CREATED  COMMAND
sim   exited (SIGKILL)  -    10.0.0.2  -        sleep 600`
	if got := lines(b.String()); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	restored := &container.Info{Status: "running"}
	restored.RestoredFrom = "sim:2"
	if s := table.Status(restored); s != "running (restored sim:2)" {
		t.Errorf("status %q", s)
	}
}

func TestPlan(t *testing.T) {
	var b strings.Builder
	f, need := 4, 2
	p := 0.5
	q := plan.Query{Nodes: 8, Replicas: 1, Failures: &f, Target: 0.99}
	rows := []plan.Row{{Placement: "ring", Replicas: 1, Failures: 4, P: &p, Tolerable: map[string]int{"90%": 1, "99%": 0, "99.9%": 0},
		Needed: &need, NeededP: 0.995}}
	if err := table.Plan(&b, q, rows); err != nil {
		t.Fatal(err)
	}
	want := `8 nodes, 1 replica(s) of every node's images

PLACEMENT  SURVIVES (90%)  (99%)  (99.9%)  P(restart | 4 failures)
ring       1 failures      0      0        0.500000

ring: 2 replica(s) survive 4 failures with P = 0.995000 >= 0.99`
	if got := lines(b.String()); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestVerify(t *testing.T) {
	var b strings.Builder
	table.Stray(&b, image.Stray{Path: "x/tmp", Reason: "not a record"})
	table.Verified(&b, image.VerifyResult{Checkpoint: "c:1", OK: true})
	table.Verified(&b, image.VerifyResult{Checkpoint: "c:2", Error: "chunk 12ab: damaged"})
	table.Store(&b, image.StoreReport{Packs: 2, Chunks: 10, Manifests: 3})
	table.Store(&b, image.StoreReport{Problems: []string{"pack 9f: missing"}})
	want := `BAD  catalog: x/tmp: not a record
ok   c:1
BAD  c:2: chunk 12ab: damaged
ok   store: 2 packs, 10 chunks, 3 manifests
BAD  store: pack 9f: missing
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestControlCharactersEscaped: text from outside (a rank's event, a
// name in a cell) cannot drive the terminal: escapes, carriage returns
// and reordering marks are shown escaped, in events and in tables.
func TestControlCharactersEscaped(t *testing.T) {
	forged := "ok\x1b[2K\rcheckpoint.durable job=other\u202e"
	line := table.Event(evv1.Event{Seq: 1, Type: evv1.RankEvent, Job: "j", Message: forged})
	if strings.ContainsAny(line, "\x1b\r\u202e") || !strings.Contains(line, `ok\x1b[2K\rcheckpoint.durable job=other\u202e`) {
		t.Fatalf("event line %q: want its control characters escaped", line)
	}
	var buf bytes.Buffer
	w := table.New(&buf)
	fmt.Fprintf(w, "NAME\tCOMMAND\n")
	fmt.Fprintf(w, "a\t%s\n", forged)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); strings.ContainsAny(out, "\x1b\r\u202e") || strings.Count(out, "\n") != 2 {
		t.Fatalf("table %q: want control characters escaped and two lines", out)
	}
	if got := table.Printable("plain\ttext é"); got != "plain\ttext é" {
		t.Fatalf("Printable changed plain text: %q", got)
	}
}

// TestCkptsUnavailable: a durable checkpoint with a rank no live node
// holds reads as unavailable, saying which rank and what it was.
func TestCkptsUnavailable(t *testing.T) {
	var b strings.Builder
	rank := func(r int, copies ...string) coordv1.CkptRank {
		return coordv1.CkptRank{Rank: r, Node: copies[0], Copies: copies}
	}
	cks := []coordv1.Ckpt{
		{Job: "ring", Seq: 1, State: coordv1.CkptProtected, Ranks: []coordv1.CkptRank{rank(0, "n1", "n2"), rank(1, "n2", "n1")}},
		{Job: "ring", Seq: 2, State: coordv1.CkptDurable, Ranks: []coordv1.CkptRank{rank(0, "n1"), rank(1, "n2")}, Unavailable: []int{1}},
		// Restored lazily from the durable tier: held by no node.
		{Job: "ring", Seq: 3, State: coordv1.CkptDurable, Ranks: []coordv1.CkptRank{{Rank: 0}, {Rank: 1}}, Flushed: &coordv1.Flushed{URL: "s3://b/p"}},
	}
	if err := table.Ckpts(&b, cks); err != nil {
		t.Fatal(err)
	}
	got := strings.Split(lines(b.String()), "\n")
	if len(got) != 4 || !strings.Contains(got[1], "protected") || strings.Contains(got[1], "unavailable") ||
		!strings.Contains(got[2], "unavailable") || !strings.HasSuffix(got[2], "durable, but no live copy of rank 1") ||
		strings.Contains(got[3], "unavailable") || !strings.HasSuffix(got[3], "rank images on no node: in the durable tier") {
		t.Errorf("got:\n%s", b.String())
	}
}

// TestContainersOneRowEach: a command with newlines, tabs and quotes
// stays on its container's row, quoted as a shell would need it.
func TestContainersOneRowEach(t *testing.T) {
	var b strings.Builder
	list := []*container.Info{
		{Name: "multi", Status: container.StatusRunning, State: container.State{Config: container.Config{Args: []string{"sh", "-c", "echo a\nb\tc"}}}},
		{Name: "plain", Status: container.StatusRunning, State: container.State{Config: container.Config{Args: []string{"/bin/sleep", "60"}}}},
	}
	if err := table.Containers(&b, list); err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(rows) != 3 || !strings.Contains(rows[1], `sh -c "echo a\nb\tc"`) || !strings.HasSuffix(rows[2], "/bin/sleep 60") {
		t.Errorf("ps table:\n%s", b.String())
	}
	if got := table.Command([]string{"a b", "", "it's", "plain"}); got != `"a b" "" "it's" plain` {
		t.Errorf("Command: %s", got)
	}
}
