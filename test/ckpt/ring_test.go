package ckpt

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestRingCheckpointRestart is the whole-job story: a 4-rank ring on 4
// nodes passing checksummed messages at full speed is checkpointed three
// times while it runs, every container is killed, and the job restarts from
// the last checkpoint with every rank on another node. It must finish with
// exactly the result of an uninterrupted run, every rank restored from
// that checkpoint rather than started afresh; the ring program itself
// fails on any lost, duplicated, reordered or damaged message.
func TestRingCheckpointRestart(t *testing.T) {
	c := testutil.NewCluster(t, 4)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "4", "--per-node", "1"}, c.RingArgs(testutil.RingMessages)...)...)
	first := c.Status("ring").Placement
	if len(slices.Compact(slices.Sorted(slices.Values(first)))) != 4 {
		t.Fatalf("placement %v: want one rank per node", first)
	}
	c.WaitProgress("ring", 4, 0, 60*time.Second)
	for i := 1; i <= 3; i++ {
		before := c.Progress("ring", 0)
		c.OK("checkpoint", "ring")
		// The job goes on after each round.
		deadline := time.Now().Add(30 * time.Second)
		for c.Progress("ring", 0) <= before {
			if time.Now().After(deadline) {
				t.Fatalf("ring made no progress after checkpoint %d", i)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	cks := c.Ckpts("ring")
	if len(cks) != 3 {
		t.Fatalf("%d checkpoints, want 3: %+v", len(cks), cks)
	}
	for _, ck := range cks {
		if !ck.Restorable() || len(ck.Ranks) != 4 {
			t.Fatalf("checkpoint %d: %s with %d ranks, want durable (or protected) with 4", ck.Seq, ck.State, len(ck.Ranks))
		}
		t.Logf("checkpoint %d: ranks frozen %s, coordination %s", ck.Seq, time.Duration(ck.Stall), time.Duration(ck.Coord))
	}
	if p := c.Progress("ring", 0); p >= testutil.RingMessages {
		t.Fatalf("the ring finished before it was killed (%d messages); make it longer", p)
	}

	// Kill every container, then restart on other nodes.
	c.OK("kill", "ring")
	for _, r := range c.Status("ring").RankStates {
		if r.Status == "running" {
			t.Fatalf("rank %d still running after kill", r.Rank)
		}
	}
	moved := append(slices.Clone(first[1:]), first[0])
	c.OK("restart", "ring", "--placement", strings.Join(moved, ","))
	st := c.Status("ring")
	for r, n := range st.Placement {
		if n == first[r] {
			t.Fatalf("rank %d restarted on its old node %s", r, n)
		}
	}
	if got, want := c.Result("ring"), ringapp.Expected(4, testutil.RingMessages, 64, 1); got != want {
		t.Fatalf("result %s, want %s (an uninterrupted run's)", got, want)
	}
	// The same result would come from a run started afresh: every rank
	// went on from the last checkpoint.
	c.CheckRestarted("ring", cks[2].Seq, testutil.RingOutput)
}

// TestPeriodicCheckpoints: the coordinator takes a job's checkpoints at its
// interval, one round at a time, and `cairn rm` removes the job with them.
func TestPeriodicCheckpoints(t *testing.T) {
	c := testutil.NewCluster(t, 2)
	c.OK(append([]string{"run", "--job", "tick", "--ranks", "2", "--checkpoint-every", "1s"}, c.RingArgs(100*testutil.RingMessages)...)...)
	testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
		n := 0
		for _, ck := range c.Ckpts("tick") {
			if ck.Restorable() {
				n++
			}
		}
		return n >= 3, fmt.Sprintf("%d durable periodic checkpoints, want 3", n)
	})
	var raw []struct {
		Seq      int       `json:"seq"`
		State    string    `json:"state"`
		Periodic bool      `json:"periodic"`
		Created  time.Time `json:"created"`
		Finished time.Time `json:"finished"`
	}
	if err := json.Unmarshal([]byte(c.OK("checkpoints", "tick", "--json")), &raw); err != nil {
		t.Fatal(err)
	}
	for i, ck := range raw {
		if !ck.Periodic || ck.Seq != i+1 {
			t.Fatalf("checkpoint %+v: want periodic, numbered %d", ck, i+1)
		}
		if i > 0 && !raw[i-1].Finished.IsZero() && ck.Created.Before(raw[i-1].Finished) {
			t.Fatalf("round %d began at %s, before round %d ended at %s", ck.Seq, ck.Created, raw[i-1].Seq, raw[i-1].Finished)
		}
		if i > 0 && ck.Created.Sub(raw[i-1].Created) < time.Second {
			t.Fatalf("rounds %d and %d only %s apart, interval 1s", raw[i-1].Seq, ck.Seq, ck.Created.Sub(raw[i-1].Created))
		}
	}
	if out, err := c.Run("rm", "tick"); err == nil || !strings.Contains(out, "--force") {
		t.Fatalf("rm of a job with checkpoints, without --force: %v\n%s", err, out)
	}
	if out := c.OK("jobs", "--json"); !strings.Contains(out, `"tick"`) {
		t.Fatalf("a refused rm removed the job: %s", out)
	}
	if out := c.OK("rm", "-f", "tick"); !strings.Contains(out, "checkpoints") {
		t.Fatalf("rm -f does not say what it deleted: %s", out)
	}
	if out := c.OK("jobs", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("jobs after rm: %s", out)
	}
	if out, _ := c.Run("checkpoints", "tick"); strings.Contains(out, "tick:") {
		t.Fatalf("checkpoints of a removed job: %s", out)
	}
	for _, n := range c.Nodes {
		for r := range 2 {
			if recs, _ := c.Repo(n).List(fmt.Sprintf("tick.%d", r)); len(recs) > 0 {
				t.Fatalf("node %s keeps %d images of the removed job's rank %d", n, len(recs), r)
			}
		}
	}

	// A job whose ranks have all exited stops being checkpointed.
	c.OK(append([]string{"run", "--job", "short", "--ranks", "2", "--checkpoint-every", "1s"}, c.RingArgs(20_000)...)...)
	c.OK("wait", "short")
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		j := c.Job("short")
		return j.State == "exited", "job " + j.State + " after its ranks exited"
	})
	n := len(c.Ckpts("short"))
	time.Sleep(3 * time.Second)
	if m := len(c.Ckpts("short")); m != n {
		t.Fatalf("%d rounds after the job exited", m-n)
	}
}
