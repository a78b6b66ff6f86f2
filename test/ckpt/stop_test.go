package ckpt

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestCheckpointStop: `cairn checkpoint JOB --stop` takes one global
// checkpoint and ends every rank at it (their containers checkpointed,
// nothing of the job running on), the job stopped; `cairn restart` on
// other nodes resumes it from there to exactly an uninterrupted run's
// result, every rank restored from that checkpoint.
func TestCheckpointStop(t *testing.T) {
	c := testutil.NewCluster(t, 2)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1"}, c.RingArgs(testutil.RingMessages)...)...)
	first := c.Status("ring").Placement
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	out := c.OK("checkpoint", "ring", "--stop")
	if !strings.Contains(out, "job ring stopped at checkpoint 1") {
		t.Fatalf("checkpoint --stop said:\n%s", out)
	}
	st := c.Status("ring")
	if st.State != "stopped" {
		t.Fatalf("job %s after checkpoint --stop, want stopped", st.State)
	}
	for _, r := range st.RankStates {
		if r.Status != "checkpointed" {
			t.Errorf("rank %d is %s after checkpoint --stop, want checkpointed", r.Rank, r.Status)
		}
	}
	// Nothing of the job runs on: its output ends where it stopped.
	at := c.Progress("ring", 0)
	if at >= testutil.RingMessages {
		t.Fatalf("the ring finished before it was stopped (%d messages); make it longer", at)
	}
	time.Sleep(2 * time.Second)
	if now := c.Progress("ring", 0); now != at {
		t.Fatalf("rank 0 went on from %d to %d messages after it was stopped", at, now)
	}
	if out, err := c.Run("checkpoint", "ring"); err == nil || !strings.Contains(out, "stopped") {
		t.Fatalf("checkpoint of a stopped job: %v\n%s", err, out)
	}
	ck := c.Ckpts("ring")
	if len(ck) != 1 || !ck[0].Restorable() {
		t.Fatalf("checkpoints after checkpoint --stop: %+v, want one restorable", ck)
	}
	moved := append(slices.Clone(first[1:]), first[0])
	c.OK("restart", "ring", "--placement", strings.Join(moved, ","))
	if got, want := c.Result("ring"), ringapp.Expected(2, testutil.RingMessages, 64, 1); got != want {
		t.Fatalf("result %s, want %s (an uninterrupted run's)", got, want)
	}
	c.CheckRestarted("ring", 1, testutil.RingOutput)
}
