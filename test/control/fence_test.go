package control

import (
	"fmt"
	"os"
	"regexp"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestPausedLeaderFenced: the leader is paused (SIGSTOP) in the middle of
// a round, its commit decided but not yet told to the ranks. A standby
// takes over, finishes that round and takes another. When the old leader
// runs again (SIGCONT) it goes on with its round as if it still led: every
// call it makes to an agent is refused for its older term; it then finds
// it no longer leads and stands by. The job is driven by the new leader
// only: the ranks run on, no round is left half done, and the ring ends
// with its exact result.
func TestPausedLeaderFenced(t *testing.T) {
	testDeposed(t, func(c *testutil.Cluster, name string) (stop, resume func()) {
		return func() { c.Signal(name, syscall.SIGSTOP) }, func() { c.Signal(name, syscall.SIGCONT) }
	})
}

// TestCutOffLeaderFenced is TestPausedLeaderFenced with the leader cut off
// from the other coordinators' etcd members instead of paused: it runs on
// throughout, reaching the agents, and goes on with its round once the
// new leader has taken over; the agents refuse it all the same. Then the
// cut heals and it stands by.
func TestCutOffLeaderFenced(t *testing.T) {
	var heal func()
	testDeposed(t, func(c *testutil.Cluster, name string) (stop, resume func()) {
		return func() { heal = c.CutFromPeers(name) }, func() {}
	})
	heal()
}

// testDeposed runs the scenario of TestPausedLeaderFenced, with the
// leader made to lose its leadership by stop and let go on by resume.
func testDeposed(t *testing.T, depose func(c *testutil.Cluster, name string) (stop, resume func())) {
	const messages = 2_500_000
	c, armed := newCluster(t, 2)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1"}, c.RingArgs(messages)...)...)
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	c.OK("checkpoint", "ring")

	old, oldTerm := c.WaitLeader(60 * time.Second)
	if err := os.WriteFile(armed, []byte("after-decision\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	held := c.CheckpointAsync("ring")
	c.WaitCoordLog(old.Name, "failpoint=after-decision", 0, 90*time.Second)
	stop, resume := depose(c, old.Name)
	stop()
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			resume()
		}
	})
	// The point stays armed: the old leader holds there until it is let go
	// on; the next leader finishes the round from its record, past the
	// point, telling every agent its term. Its log says so at once, where
	// the CLI, which asks the old leader first, takes seconds; and the old
	// leader keeps its agent clients for its requests in flight only that
	// long (a minute).
	finished := regexp.MustCompile(`msg=leading name=(\S+) term=(\S+)(?s:.*)msg="round ended" job=ring ckpt=2 state=durable`)
	var next, newTerm string
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		for _, co := range c.File().Coordinators {
			if m := finished.FindStringSubmatch(c.CoordLog(co.Name)); co.Name != old.Name && m != nil {
				next, newTerm = m[1], m[2]
				return true, ""
			}
		}
		return false, "no other coordinator has finished round 2"
	})
	t.Logf("%s (term %s) deposed; %s leads (term %s) and finished round 2", old.Name, oldTerm, next, newTerm)

	refused := regexp.MustCompile(`msg="refused a call of a replaced coordinator".* term=` + regexp.QuoteMeta(oldTerm))
	count := func() int {
		n := 0
		for _, node := range c.Nodes {
			n += len(refused.FindAllString(c.AgentLog(node), -1))
		}
		return n
	}
	if n := count(); n != 0 {
		t.Fatalf("agents refused %d calls of term %s while its coordinator was held", n, oldTerm)
	}
	// The old leader goes on with its round.
	resume()
	resumed = true
	if err := os.Remove(armed); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
		return count() >= len(c.Nodes), fmt.Sprintf("agents refused %d calls of the deposed leader's term %s once it went on", count(), oldTerm)
	})
	c.WaitCoordLog(old.Name, "lost the leadership", 0, 60*time.Second)
	waitCkpt(t, c, 2, func(ck testutil.Ckpt) bool { return ck.Restorable() })
	if err := <-held; err == nil {
		t.Error("the deposed leader's checkpoint was answered as a success")
	} else {
		t.Logf("the deposed leader's checkpoint: %v", err)
	}
	// Whoever leads now leads with a term no older than the one that took
	// over: the old term never comes back. (The old leader's etcd member,
	// if it led etcd's raft when it stopped, may upset the others' sessions
	// as it comes back, and cause another take-over.)
	now, nowTerm := c.WaitLeader(30 * time.Second)
	if n, taken := parseTerm(t, nowTerm), parseTerm(t, newTerm); n.Older(taken) || nowTerm == oldTerm {
		t.Fatalf("%s leads with term %s after the old leader went on; %s took over with %s", now.Name, nowTerm, next, newTerm)
	}
	for _, ck := range c.Ckpts("ring") {
		if ck.State == "preparing" || ck.State == "committed" {
			t.Fatalf("checkpoint %d left %s", ck.Seq, ck.State)
		}
	}
	if got, want := c.Result("ring"), ringapp.Expected(2, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	for _, r := range c.Status("ring").RankStates {
		if r.ExitCode == nil || *r.ExitCode != 0 {
			t.Errorf("rank %d: %s", r.Rank, r.Status)
		}
	}
}

func parseTerm(t *testing.T, s string) agentv1.Term {
	t.Helper()
	term, err := agentv1.ParseTerm(s)
	if err != nil {
		t.Fatal(err)
	}
	return term
}
