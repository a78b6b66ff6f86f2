package control

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// points are the coordinator failpoints the tests of this package hold
// leaders at; which holds is armed by a file's content.
var points = []string{"job-before-running", "after-decision", "before-replication", "restart-before-resume", "migration-before-resume"}

// newCluster starts a cluster of nodes nodes and 3 coordinators, every
// coordinator able to hold at points once armed (write a point's name in
// the returned file).
func newCluster(t *testing.T, nodes int) (*testutil.Cluster, string) {
	armed := filepath.Join(t.TempDir(), "armed")
	t.Setenv(failpoint.Env, strings.Join(points, ","))
	t.Setenv(failpoint.ArmedEnv, armed)
	return testutil.NewCluster(t, nodes, "--coordinators", "3"), armed
}

// TestLeaderKilled: on a cluster of 3 coordinators, the leader is
// SIGKILLed in the middle of a job start, a round (its commit decided,
// not yet told), the replication of a checkpoint, a restart (every rank
// restored, none resumed) and a migration (the rank on its new node, not
// resumed). Each time a standby takes over with a newer term and
// finishes what was left: the job runs, the round is durable and then
// protected, the restart and the migration are done, before any agent's
// hold ends. The killed coordinator comes back as a standby each time.
// No rank ever ran twice, and the ring ends with its exact result.
func TestLeaderKilled(t *testing.T) {
	const messages = 4_000_000
	c, armed := newCluster(t, 3)
	var terms []string
	// killAt arms fp, starts act, SIGKILLs the leader once it holds at fp,
	// and returns act's outcome once a standby leads.
	killAt := func(fp string, act func() (string, error)) error {
		t.Helper()
		leader, term := c.WaitLeader(60 * time.Second)
		terms = append(terms, term)
		before := strings.Count(c.CoordLog(leader.Name), "failpoint="+fp)
		if err := os.WriteFile(armed, []byte(fp+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			out, err := act()
			if err != nil {
				err = fmt.Errorf("%v: %s", err, out)
			}
			done <- err
		}()
		c.WaitCoordLog(leader.Name, "failpoint="+fp, before, 90*time.Second)
		restart := c.KillCoordinatorNamed(leader.Name)
		if err := os.Remove(armed); err != nil {
			t.Fatal(err)
		}
		next, _ := c.WaitLeader(60*time.Second, leader.Name)
		t.Logf("%s: %s killed, %s leads", fp, leader.Name, next.Name)
		restart()
		return <-done
	}

	// A job start: every rank runs, the job is not recorded running.
	err := killAt("job-before-running", func() (string, error) {
		return c.Run(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1"}, c.RingArgs(messages)...)...)
	})
	t.Logf("cairn run through the killed leader: %v", err)
	job := waitJob(t, c, func(j testutil.Job) bool { return j.State == "running" })
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	if job.Restarts != 0 {
		t.Fatalf("the job start finished by a standby restarted the job: %+v", job)
	}
	c.OK("checkpoint", "ring")

	// A round whose commit is decided, not yet told to the ranks.
	if err := killAt("after-decision", func() (string, error) { return c.Run("checkpoint", "ring") }); err == nil {
		t.Log("the checkpoint through the killed leader was answered")
	}
	waitCkpt(t, c, 2, func(ck testutil.Ckpt) bool { return ck.Restorable() })
	c.Moves("ring", 2, 60*time.Second)

	// The replication of a durable checkpoint.
	if err := killAt("before-replication", func() (string, error) { return c.Run("checkpoint", "ring") }); err != nil {
		t.Fatalf("the checkpoint was durable before its replication: %v", err)
	}
	waitCkpt(t, c, 3, func(ck testutil.Ckpt) bool { return ck.State == "protected" })

	// A restart: every rank restored, frozen, none resumed.
	c.OK("kill", "ring")
	killAt("restart-before-resume", func() (string, error) { return c.Run("restart", "ring") })
	job = waitJob(t, c, func(j testutil.Job) bool { return j.State == "running" && j.Restarts == 1 })
	if job.RestoredFrom != 3 {
		t.Fatalf("the restart finished by a standby restored checkpoint %d, want 3", job.RestoredFrom)
	}
	c.Moves("ring", 2, 60*time.Second)

	// A migration: the rank recorded on its new node and removed from the
	// old one, nothing resumed.
	place := c.Status("ring").Placement
	free := c.Unused(place)
	killAt("migration-before-resume", func() (string, error) { return c.Run("migrate", "ring/1", "--to", free) })
	var m coordv1.Migration
	testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
		out, err := c.Run("migrations", "ring", "--json")
		var ms []coordv1.Migration
		if err != nil || json.Unmarshal([]byte(out), &ms) != nil || len(ms) == 0 {
			return false, "migrations: " + out
		}
		m = ms[len(ms)-1]
		return m.State == "done" && strings.Contains(m.Reason, "restarted coordinator"), fmt.Sprintf("migration %+v", m)
	})
	if p := c.Status("ring").Placement; p[1] != free {
		t.Fatalf("rank 1 is on %s after the migration, want %s", p[1], free)
	}
	noHoldExpired(t, c)

	if got, want := c.Result("ring"), ringapp.Expected(2, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	// Rank 0 went on from the restart's checkpoint, rank 1 from its
	// migration's image: each restored once, never started afresh.
	c.CheckRestored("ring", 0, 3, testutil.RingOutput)
	c.CheckRestored("ring", 1, m.Seq, testutil.RingOutput)
	list, err := c.Coordinators()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Errorf("%d coordinators run at the end, want 3: %+v", len(list), list)
	}
	// Every take-over took a newer term.
	_, term := c.WaitLeader(time.Minute)
	terms = append(terms, term)
	for i := 1; i < len(terms); i++ {
		if terms[i] == terms[i-1] {
			t.Errorf("terms %v: a take-over kept the term", terms)
		}
	}
	t.Logf("terms %v", terms)
}

// waitJob waits until the cluster's one job is as ok wants.
func waitJob(t *testing.T, c *testutil.Cluster, ok func(testutil.Job) bool) testutil.Job {
	t.Helper()
	var j testutil.Job
	testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
		j = c.Job("ring")
		return ok(j), fmt.Sprintf("job %+v", j)
	})
	return j
}

// waitCkpt waits until checkpoint seq of the ring is as ok wants.
func waitCkpt(t *testing.T, c *testutil.Cluster, seq int, ok func(testutil.Ckpt) bool) {
	t.Helper()
	testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
		for _, ck := range c.Ckpts("ring") {
			if ck.Seq == seq {
				return ok(ck), fmt.Sprintf("checkpoint %d is %s (%s)", seq, ck.State, ck.Reason)
			}
		}
		return false, fmt.Sprintf("no checkpoint %d", seq)
	})
}

// noHoldExpired fails t if an agent acted on its own at the end of a
// hold: the leaders that took over did not finish in time.
func noHoldExpired(t *testing.T, c *testutil.Cluster) {
	t.Helper()
	for _, n := range c.Nodes {
		for line := range strings.SplitSeq(c.AgentLog(n), "\n") {
			if strings.Contains(line, "within the hold") {
				t.Fatalf("the agent of %s acted on its own at the end of its hold:\n%s", n, line)
			}
		}
	}
}
