package ops

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// counterScript prints "line N" every 50 ms, N from 1.
const counterScript = `i=0; while :; do i=$((i+1)); echo "line $i"; sleep 0.05; done`

var counterLineRE = regexp.MustCompile(`^line (\d+)$`)

// counterOutput is counterScript's: a count, and nothing at its start.
var counterOutput = testutil.Output{Progress: counterLineRE}

// countedLines checks that out counts "line 1", "line 2", ... without a
// gap or a repeat, and returns how many lines it has.
func countedLines(t *testing.T, what, out string) int {
	t.Helper()
	if out == "" {
		return 0
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range lines {
		if m := counterLineRE.FindStringSubmatch(l); m == nil || m[1] != strconv.Itoa(i+1) {
			t.Fatalf("%s: line %d is %q, want \"line %d\" (a gap or a repeat)\n%s", what, i+1, l, i+1, out[max(0, len(out)-400):])
		}
	}
	return len(lines)
}

// labelledLines splits the output of `cairn logs JOB` into each rank's
// lines, in order, checking every line has a rank's label; order lists
// the rank of every line.
func labelledLines(t *testing.T, out string, ranks int) (per []string, order []int) {
	t.Helper()
	per = make([]string, ranks)
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		label, rest, ok := strings.Cut(l, ": ")
		r, err := strconv.Atoi(label)
		if !ok || err != nil || r < 0 || r >= ranks {
			t.Fatalf("line %q has no rank label", l)
		}
		per[r] += rest + "\n"
		order = append(order, r)
	}
	return per, order
}

func incarnations(t *testing.T, c *testutil.Cluster, ref string) []agentv1.Incarnation {
	t.Helper()
	var incs []agentv1.Incarnation
	if err := json.Unmarshal([]byte(c.OK("logs", ref, "--incarnations", "--json")), &incs); err != nil {
		t.Fatal(err)
	}
	return incs
}

// TestJobLogsAcrossRestart: a job's output survives a restart. Both ranks
// are checkpointed, print on past the checkpoint and are killed; rank 0
// restarts on another node, rank 1 on its own. Each rank's log then reads
// as an uninterrupted run's: the output up to the checkpoint, then the
// restored processes', nothing of the killed run's after the checkpoint.
// That is kept on rank 1's node as its incarnation 1. `cairn logs JOB`
// labels every rank's lines, rank after rank, or with -f as they come.
func TestJobLogsAcrossRestart(t *testing.T) {
	c := testutil.NewCluster(t, 3)
	c.OK("run", "--job", "cnt", "--ranks", "2", "--per-node", "1", "--", "sh", "-c", counterScript)
	first := c.Status("cnt").Placement
	free := c.Unused(first)

	// Follow both ranks from the start until they are killed.
	var followed bytes.Buffer
	follow := exec.Command(c.Bin, "--data", c.Data, "--staging", c.Staging, "logs", "-f", "cnt")
	follow.Stdout, follow.Stderr = &followed, &followed
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	var followErr error
	followDone := make(chan struct{})
	go func() { followErr = follow.Wait(); close(followDone) }()
	t.Cleanup(func() {
		select {
		case <-followDone:
		default:
			_ = syscall.Kill(follow.Process.Pid, syscall.SIGKILL)
			<-followDone
		}
	})

	lines := func(r int) int { return strings.Count(c.Logs("cnt", r), "\n") }
	waitLines := func(r, n int, what string) {
		t.Helper()
		testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
			got := lines(r)
			return got >= n, fmt.Sprintf("rank %d has %d lines, want %d %s", r, got, n, what)
		})
	}
	for r := range 2 {
		waitLines(r, 10, "before the checkpoint")
	}
	c.OK("checkpoint", "cnt")
	checkpointed := time.Now()
	for r := range 2 {
		waitLines(r, lines(r)+10, "past the checkpoint")
	}
	c.OK("kill", "cnt")
	select {
	case <-followDone:
		if followErr != nil {
			t.Fatalf("cairn logs -f cnt: %v\n%s", followErr, followed.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("cairn logs -f cnt goes on after every rank was killed")
	}
	died := []string{c.Logs("cnt", 0), c.Logs("cnt", 1)}
	per, order := labelledLines(t, followed.String(), 2)
	for r := range 2 {
		if got, want := countedLines(t, fmt.Sprintf("rank %d followed", r), per[r]), countedLines(t, "killed", died[r]); got != want {
			t.Errorf("following rank %d printed %d lines, its log has %d", r, got, want)
		}
	}
	if slices.IsSorted(order) || slices.IsSortedFunc(order, func(a, b int) int { return b - a }) {
		t.Errorf("-f printed the ranks one after the other, not as their lines came: %v", order)
	}

	restarted := time.Now()
	c.OK("restart", "cnt", "--placement", free+","+first[1])
	for r := range 2 {
		waitLines(r, strings.Count(died[r], "\n")+5, "after the restart")
	}
	for r := range 2 {
		ref := fmt.Sprintf("cnt/%d", r)
		now := c.OK("logs", ref)
		countedLines(t, ref+" after the restart", now)
		incs := incarnations(t, c, ref)
		cur := incs[len(incs)-1]
		if !cur.Current || cur.N != 2 || cur.RestoredFrom != fmt.Sprintf("cnt.%d:1", r) {
			t.Fatalf("rank %d's current incarnation: %+v", r, cur)
		}
		// The history is what the killed run printed up to the checkpoint;
		// it printed more, which is not in the new log.
		kept := int(cur.Restored)
		if kept == 0 || kept >= len(died[r]) || now[:kept] != died[r][:kept] {
			t.Fatalf("rank %d restored %d bytes of output; the killed run had printed %d", r, kept, len(died[r]))
		}
	}
	c.CheckRestarted("cnt", 1, counterOutput)
	checkLogTimes(t, c, checkpointed, restarted)
	// Rank 0 moved: its node has only the current incarnation. Rank 1
	// restarted in place and keeps the killed run's output.
	if incs := incarnations(t, c, "cnt/0"); len(incs) != 1 {
		t.Errorf("rank 0's incarnations on %s: %+v", free, incs)
	}
	incs := incarnations(t, c, "cnt/1")
	if len(incs) != 2 || incs[0].N != 1 || incs[0].Current || incs[0].Signal != "SIGKILL" {
		t.Fatalf("rank 1's incarnations: %+v", incs)
	}
	if got := c.OK("logs", "cnt/1", "--incarnation", "1"); got != died[1] {
		t.Fatalf("rank 1's incarnation 1 has %d bytes of output, the killed run printed %d", len(got), len(died[1]))
	}

	// Without -f: every rank's output, labelled, rank after rank.
	per, order = labelledLines(t, c.OK("logs", "cnt"), 2)
	if !slices.IsSorted(order) {
		t.Errorf("cairn logs cnt mixed the ranks: %v", order)
	}
	for r := range 2 {
		if countedLines(t, fmt.Sprintf("rank %d labelled", r), per[r]) <= strings.Count(died[r], "\n") {
			t.Errorf("rank %d: the labelled output is not the restored log", r)
		}
	}
	c.OK("rm", "-f", "cnt")
}

// stampedRE is a line of `cairn logs -t`: its time, then the line.
var stampedRE = regexp.MustCompile(`^(\S+) (line \d+)$`)

// checkLogTimes checks the times of the counter job's lines after its
// restart: what each rank printed up to the checkpoint came before
// checkpointed, with the times it had on the node it ran on (rank 0 has
// moved: they came with the image), what the restored processes printed
// after restarted; --since restarted prints the latter only, and the
// job's labelled output has the times too.
func checkLogTimes(t *testing.T, c *testutil.Cluster, checkpointed, restarted time.Time) {
	t.Helper()
	for r := range 2 {
		ref := fmt.Sprintf("cnt/%d", r)
		incs := incarnations(t, c, ref)
		kept := int(incs[len(incs)-1].Restored)
		plain := c.OK("logs", ref)
		keptLines := strings.Count(plain[:kept], "\n")
		stamped := c.OK("logs", "-t", ref)
		var prev time.Time
		for i, l := range strings.Split(strings.TrimSuffix(stamped, "\n"), "\n") {
			m := stampedRE.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("%s: line %d of logs -t is %q", ref, i+1, l)
			}
			at, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil || at.Before(prev) || m[2] != fmt.Sprintf("line %d", i+1) {
				t.Fatalf("%s: line %d of logs -t is %q (%v; the one before came at %s)", ref, i+1, l, err, prev)
			}
			if i < keptLines && at.After(checkpointed) || i >= keptLines && at.Before(restarted) {
				t.Fatalf("%s: line %d came at %s; checkpointed at %s, restarted at %s, %d lines kept", ref, i+1, m[1], checkpointed, restarted, keptLines)
			}
			prev = at
		}
		since := c.OK("logs", "--since", restarted.Format(time.RFC3339Nano), ref)
		if first, _, _ := strings.Cut(since, "\n"); first != fmt.Sprintf("line %d", keptLines+1) {
			t.Fatalf("%s: logs --since the restart starts with %q; %d lines were kept from the checkpoint", ref, first, keptLines)
		}
	}
	for _, l := range strings.Split(strings.TrimSuffix(c.OK("logs", "-t", "--tail", "4", "cnt"), "\n"), "\n") {
		label, rest, _ := strings.Cut(l, ": ")
		if (label != "0" && label != "1") || !stampedRE.MatchString(rest) {
			t.Fatalf("logs -t of the job: line %q", l)
		}
	}
}
