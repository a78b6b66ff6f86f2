package ckpt

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestRoundAborts: a participant that dies during prepare, or whose dump
// fails, aborts the round (for that, not at its deadline); the other ranks
// are thawed at once, the job goes on, and the previous checkpoint stays
// durable and restorable.
func TestRoundAborts(t *testing.T) {
	const messages = 1_500_000
	// The deadline is far off: a round that ends sooner ended for its
	// participant.
	c := testutil.NewCluster(t, 4, "--deadline", "60s")
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "4", "--per-node", "1"}, c.RingArgs(messages)...)...)
	c.WaitProgress("ring", 4, 0, 60*time.Second)
	c.OK("checkpoint", "ring")

	// 1. The agent of rank 1's node dies while the ranks prepare: once its
	// rank is prepared (frozen, dumped), before it answers.
	victim := c.Status("ring").Placement[1]
	c.RestartAgent(victim, failpoint.Env+"=prepared")
	done := c.CheckpointAsync("ring")
	c.WaitAgentLog(victim, "failpoint=prepared", 60*time.Second)
	restart := c.KillAgent(victim)
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "abort") {
		t.Fatalf("checkpoint with a dead agent: %v, want aborted", err)
	}
	if ck := c.Ckpts("ring")[1]; !strings.HasPrefix(ck.Reason, "rank 1 lost") || ck.Ranks[1].State != "lost" {
		t.Fatalf("round %d aborted for %q, rank 1 %s: want rank 1 lost with its agent", ck.Seq, ck.Reason, ck.Ranks[1].State)
	}
	st := c.Status("ring")
	for _, r := range st.RankStates {
		if r.Node != victim && r.Status != "running" {
			t.Fatalf("rank %d on %s is %s after the abort, want running", r.Rank, r.Node, r.Status)
		}
	}
	// The dead agent's rank stays frozen until an agent comes back to its
	// node: the new agent thaws and unlocks it, and the ring moves on.
	restart()
	c.WaitNodes(4, 30*time.Second)
	c.Moves("ring", 4, 60*time.Second)

	// 2. Rank 2's dump fails: its node's staging has no room.
	node2 := c.Status("ring").Placement[2]
	staging := filepath.Join(c.Staging, node2)
	if err := os.MkdirAll(staging, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", staging, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(staging, syscall.MNT_DETACH) })
	out, err := c.Run("checkpoint", "ring")
	if err == nil || !strings.Contains(out, "abort") {
		t.Fatalf("checkpoint with a failing dump: %v\n%s", err, out)
	}
	t.Logf("round with a failing dump: %s", strings.TrimSpace(out))
	if err := syscall.Unmount(staging, 0); err != nil {
		t.Fatal(err)
	}
	c.Moves("ring", 4, 60*time.Second)

	cks := c.Ckpts("ring")
	want := []string{"durable", "aborted", "aborted"}
	if len(cks) != len(want) {
		t.Fatalf("%d checkpoints, want %d: %+v", len(cks), len(want), cks)
	}
	for i, ck := range cks {
		if ck.State != want[i] && !(want[i] == "durable" && ck.Restorable()) {
			t.Fatalf("checkpoint %d is %s (%s), want %s", ck.Seq, ck.State, ck.Reason, want[i])
		}
	}
	if !strings.Contains(cks[2].Reason, "rank 2") {
		t.Errorf("abort reason %q does not name rank 2", cks[2].Reason)
	}
	// The job is healthy: a new round commits.
	c.OK("checkpoint", "ring")

	// The first checkpoint is still restorable, and the job finishes right.
	c.OK("kill", "ring")
	c.OK("restart", "ring", "--from", "1")
	if got, want := c.Result("ring"), ringapp.Expected(4, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	c.CheckRestarted("ring", 1, testutil.RingOutput)
}

// TestCoordinatorDeath kills the coordinator in the middle of rounds: with
// every rank prepared but no decision, and with the commit decided but not
// yet sent. In both cases no rank stays frozen or network-locked for good:
// each agent thaws and unlocks its rank at the end of its hold, with no
// coordinator. The restarted coordinator resolves the round: the first
// aborts, the second becomes durable, and no checkpoint is left
// half-committed. The committed one then restores the job correctly.
func TestCoordinatorDeath(t *testing.T) {
	const messages = 2_000_000
	const deadline, hold = 4 * time.Second, 14 * time.Second // hold: the coordinator's default, deadline + 10s
	c := testutil.NewCluster(t, 3, "--deadline", deadline.String())
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "3"}, c.RingArgs(messages)...)...)
	place := c.Status("ring").Placement
	c.WaitProgress("ring", 3, 0, 60*time.Second)
	c.OK("checkpoint", "ring")
	nets := c.RankNetns("ring") // asked now: the coordinator is down at times below

	for i, fp := range []string{"before-decision", "after-decision"} {
		seq := 2 + i // the round held at fp
		restart := c.KillCoordinator()
		restart(failpoint.Env + "=" + fp)
		c.WaitNodes(3, 30*time.Second)
		done := c.CheckpointAsync("ring")
		c.WaitFailpoint(fp, 30*time.Second)
		// Every rank is prepared: frozen, network locked.
		for _, ns := range nets {
			if locked, err := netw.NetnsLocked(context.Background(), ns); err != nil || !locked {
				t.Fatalf("%s: rank netns %s locked=%v (%v) while prepared", fp, ns, locked, err)
			}
		}
		restart = c.KillCoordinator()
		if err := <-done; err == nil {
			t.Fatalf("%s: checkpoint succeeded though its coordinator died", fp)
		}
		// The agents give up on the round after their hold: they thaw and
		// unlock their ranks, no coordinator running.
		testutil.WaitUntil(t, hold+time.Minute, func() (bool, string) {
			for _, ns := range nets {
				if locked, err := netw.NetnsLocked(context.Background(), ns); err != nil || locked {
					return false, fmt.Sprintf("%s: rank netns %s still locked (%v), hold %s", fp, ns, err, hold)
				}
			}
			return true, ""
		})
		for r, n := range place {
			thawed := regexp.MustCompile(fmt.Sprintf(`msg="no decision within the hold: thawing".* rank=ring\.%d ckpt=%d `, r, seq))
			if !thawed.MatchString(c.AgentLog(n)) {
				t.Fatalf("%s: rank %d's agent on %s did not thaw it at the end of its hold (no %s in its log)", fp, r, n, thawed)
			}
		}
		// TCP's retransmission timer backed off during the long lock: the
		// ring may take a while longer to move again.
		c.Moves("ring", 3, 60*time.Second)
		restart()
		c.WaitNodes(3, 30*time.Second)
		for _, r := range c.Status("ring").RankStates {
			if r.Status != "running" {
				t.Fatalf("%s: rank %d is %s after the hold", fp, r.Rank, r.Status)
			}
		}
		// The restarted coordinator resolves the round.
		want := map[string]string{"before-decision": "aborted", "after-decision": "durable"}[fp]
		testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
			cks := c.Ckpts("ring")
			last := cks[len(cks)-1]
			return last.State == want || want == "durable" && last.Restorable(), fmt.Sprintf("%s: round %d is %s (%s), want %s", fp, last.Seq, last.State, last.Reason, want)
		})
	}
	for _, ck := range c.Ckpts("ring") {
		if ck.State == "preparing" || ck.State == "committed" {
			t.Fatalf("checkpoint %d left %s", ck.Seq, ck.State)
		}
	}
	// The round committed before the coordinator died restores the job.
	cks := c.Ckpts("ring")
	last := cks[len(cks)-1]
	c.OK("kill", "ring")
	c.OK("restart", "ring", "--from", fmt.Sprint(last.Seq))
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	c.CheckRestarted("ring", last.Seq, testutil.RingOutput)
}

// TestCoordinatorDiesMidRestart kills the coordinator once every rank of a
// restart is restored, frozen with its network locked, and before any
// resumes: left there, the ranks would stay frozen and the job
// "restarting" for good. The next coordinator finishes the restart from
// the same checkpoint: the job runs again, restored from checkpoint 1
// rather than started afresh, and finishes with the exact result.
func TestCoordinatorDiesMidRestart(t *testing.T) {
	const messages = 1_500_000
	c := testutil.NewCluster(t, 3)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "3", "--on-failure", "stop"}, c.RingArgs(messages)...)...)
	c.WaitProgress("ring", 3, 0, 60*time.Second)
	c.OK("checkpoint", "ring")
	restart := c.KillCoordinator()
	restart(failpoint.Env + "=restart-before-resume")
	c.WaitNodes(3, 30*time.Second)
	c.OK("kill", "ring")
	done := make(chan error, 1)
	go func() {
		_, err := c.Run("restart", "ring")
		done <- err
	}()
	c.WaitFailpoint("restart-before-resume", 90*time.Second)
	restart = c.KillCoordinator()
	if err := <-done; err == nil {
		t.Fatal("cairn restart succeeded though its coordinator died")
	}
	restart()
	waitJob(t, c, func(j testutil.Job) bool { return j.State == "running" && j.RestoredFrom == 1 && j.Restarts == 1 })
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	c.CheckRestarted("ring", 1, testutil.RingOutput)
}

// TestCoordinatorDiesMidJobStart kills the coordinator once every rank of
// a new job runs, before the job is recorded running: left there, the job
// would stay "starting" for good, with no periodic checkpoint, restart or
// migration. The next coordinator sees every rank running and records the
// job running; the ring finishes with the exact result, and a checkpoint
// of it commits.
func TestCoordinatorDiesMidJobStart(t *testing.T) {
	const messages = 1_500_000
	c := testutil.NewCluster(t, 3)
	c.KillCoordinator()(failpoint.Env + "=job-before-running")
	c.WaitNodes(3, 30*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := c.Run(append([]string{"run", "--job", "ring", "--ranks", "3"}, c.RingArgs(messages)...)...)
		done <- err
	}()
	c.WaitFailpoint("job-before-running", 90*time.Second)
	restart := c.KillCoordinator()
	if err := <-done; err == nil {
		t.Fatal("cairn run succeeded though its coordinator died")
	}
	restart()
	waitJob(t, c, func(j testutil.Job) bool { return j.State == "running" })
	c.WaitProgress("ring", 3, 0, 60*time.Second)
	c.OK("checkpoint", "ring")
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
}

// waitJob waits, through a coordinator that may still be starting, until
// the cluster's one job is as ok wants.
func waitJob(t *testing.T, c *testutil.Cluster, ok func(testutil.Job) bool) {
	t.Helper()
	testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
		out, err := c.Run("jobs", "--json")
		if err != nil {
			return false, "cairn jobs: " + out
		}
		var jobs []testutil.Job
		if err := json.Unmarshal([]byte(out), &jobs); err != nil || len(jobs) != 1 {
			return false, "cairn jobs: " + out
		}
		return ok(jobs[0]), fmt.Sprintf("job %+v", jobs[0])
	})
}
