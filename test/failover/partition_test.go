package failover

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

var noSelfFence = flag.Bool("no-self-fence", false, "run TestPartitionedNode's cut-off agent with --self-fence=off, to see the test fail")

// TestPartitionedNode: a node cut off the underlay while its agent and
// its rank go on running. Its agent hears no coordinator and freezes the
// rank before the coordinator, seeing the node's lease expire, restarts
// the job elsewhere from its replicas. When the link heals, the node's
// agent reports the frozen rank and is told it runs elsewhere now: it
// stops it there, and lets go of its network: a rank of the job then
// moves onto the node. Exactly one copy of each rank runs at every moment
// from the restart on, and the ring ends with an uninterrupted run's
// result.
func TestPartitionedNode(t *testing.T) {
	const messages = 1_500_000
	c := testutil.NewCluster(t, 3)
	spare := c.Nodes[2]
	c.OK("node", "spare", spare)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1", "--replicas", "1"}, c.RingArgs(messages)...)...)
	before := c.Status("ring").Placement
	if slices.Contains(before, spare) {
		t.Fatalf("a rank was placed on the spare: %v", before)
	}
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	c.OK("checkpoint", "ring")
	c.WaitProtected("ring", 60*time.Second)

	cut := before[1]
	rank := agentv1.RankName("ring", 1)
	// One coordinator: its agents fence themselves only when told to.
	fence := "--self-fence=on"
	if *noSelfFence {
		fence = "--self-fence=off"
	}
	c.RestartAgentWith(cut, fence)
	heal := c.Partition(cut)
	start := time.Now()
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		j := c.Job("ring")
		return j.Restarts >= 1 && j.State == "running" && !slices.Contains(j.Placement, cut),
			fmt.Sprintf("job %s on %v, %d restarts (%s)", j.State, j.Placement, j.Restarts, j.Reason)
	})
	restarted := time.Since(start)
	now := c.Job("ring").Placement
	if st := c.NodeContainers(now[1])[rank]; st != container.StatusRunning {
		t.Fatalf("the restarted %s on %s is %s, want running", rank, now[1], st)
	}
	// The copy left on the cut-off node must not run beside it.
	if st := c.NodeContainers(cut)[rank]; st != container.StatusPaused {
		t.Fatalf("%s on the cut-off node %s is %s while it runs on %s too, want paused (fenced)", rank, cut, st, now[1])
	}
	// And it froze before the restarted copy was resumed: both logs are
	// written on this host, by its clock.
	frozen := logTime(t, c.AgentLog(cut), "no coordinator answers: rank frozen")
	if resumed := logTime(t, c.CoordinatorLog(), "job restarted"); !frozen.Before(resumed) {
		t.Fatalf("the cut-off node froze its rank at %s, after the job was resumed elsewhere at %s", frozen, resumed)
	}
	t.Logf("the job restarted on %v %s after the cut, while the cut-off node held its copy frozen", now, restarted.Round(100*time.Millisecond))

	heal()
	c.WaitAgentLog(cut, "the rank runs elsewhere now: stopped here", 60*time.Second)
	if st := c.NodeContainers(cut)[rank]; st.Live() {
		t.Fatalf("%s on the healed node %s is %s, want it stopped: it runs elsewhere", rank, cut, st)
	}
	if log := c.AgentLog(cut); strings.Contains(log, "rank is still this node's: thawed") {
		t.Fatalf("the healed node thawed its rank, which runs elsewhere:\n%s", log)
	}
	// The stopped copy let go of its network on the node: a rank of the
	// job moved there reaches rank 1 where it runs now. (The node held
	// rank 1's address as attached before, and refused the move.)
	c.CheckRestarted("ring", 1, testutil.RingOutput)
	m := c.Migrate("ring/0", "--to", cut)
	if p := c.Job("ring").Placement; p[0] != cut {
		t.Fatalf("after moving rank 0 to %s the job is on %v", cut, p)
	}
	c.CheckRestored("ring", 0, m.Seq, testutil.RingOutput)
	if got, want := c.Result("ring"), ringapp.Expected(2, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
}

// logTime is the time of the first line of log (slog's text) with msg.
func logTime(t *testing.T, log, msg string) time.Time {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, msg) || !strings.HasPrefix(line, "time=") {
			continue
		}
		f, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, f)
		if err != nil {
			t.Fatalf("time of %q: %v", line, err)
		}
		return at
	}
	t.Fatalf("no %q in the log:\n%s", msg, log)
	return time.Time{}
}
