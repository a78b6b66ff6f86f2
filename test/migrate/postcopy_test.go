package migrate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// postCopyBallast is the MiB of ballast each ring rank holds in the
// post-copy tests: most of the moving rank's memory, which must all cross
// after it runs again.
const postCopyBallast = 160

// postCopyChurn: every rank writes a page of its ballast every 16
// messages (ringapp -churn), round and round, and checks every page's
// writes at the end: the moving rank writes pages whose old contents are
// still on the source, and must find them there.
const postCopyChurn = 16

// ballastRing runs a 3-rank ring with ballast on 3 of 4 nodes, one rank
// each, checkpointed once (protected) while it runs. Rank 0 holds a
// thousand messages before the end (ringapp -hold) until the test
// releases it: on a slow machine, the replication alone has taken longer
// than the whole run.
func ballastRing(t *testing.T, messages int) (c *testutil.Cluster, place []string, free string) {
	t.Helper()
	c = testutil.NewCluster(t, 4)
	c.OK("run", "--job", "ring", "--ranks", "3", "--per-node", "1", "--replicas", "1", "--",
		c.Bin, "ringapp", "-messages", strconv.Itoa(messages), "-ballast", strconv.Itoa(postCopyBallast), "-churn", strconv.Itoa(postCopyChurn),
		"-hold", strconv.Itoa(messages-1000))
	place = c.Status("ring").Placement
	free = c.Unused(place)
	c.WaitProgress("ring", 3, 0, 90*time.Second)
	c.OK("checkpoint", "ring")
	c.WaitProtected("ring", 90*time.Second)
	return c, place, free
}

// postCopyDone matches the target's log line for a post-copy migration
// whose every page arrived.
var postCopyDone = regexp.MustCompile(`msg="post-copy migration: every page is here" ckpt=ring\.1:(\d+) peer=\S+ pages=(\d+)`)

// TestPostCopyMigration: rank 1 of a running ring, holding 160 MiB of
// ballast it keeps writing, moves with --post-copy while the ring passes
// checksummed messages: the job waits for the dump and the rank's files, not its
// memory, which the target reads from the source once the rank runs. The
// target's page server serves at least the ballast after the rank
// resumed, the source drops its pages once told, the other ranks are the
// same processes, and the job ends with the uninterrupted run's result,
// every rank's ballast checked (the ring fails on any bad message, and a
// rank on a ballast page not as its writes left it).
func TestPostCopyMigration(t *testing.T) {
	const messages = 1_500_000
	c, place, free := ballastRing(t, messages)
	pids := map[int]int{}
	for _, r := range c.Status("ring").RankStates {
		pids[r.Rank] = r.Pid
	}
	m := c.Migrate("ring/1", "--to", free, "--post-copy")
	if m.State != "done" || m.To != free || !m.PostCopy {
		t.Fatalf("post-copy migration: %+v", m)
	}
	// The files moved before the rank ran are far smaller than its
	// memory: the pages came after.
	if m.Bytes >= postCopyBallast<<20 {
		t.Errorf("the post-copy migration moved %d bytes before the rank ran, its ballast alone is %d", m.Bytes, postCopyBallast<<20)
	}
	c.ReleaseRing("ring")
	for _, r := range c.Status("ring").RankStates {
		if r.Rank != 1 && r.Pid != pids[r.Rank] {
			t.Errorf("rank %d was restarted: pid %d, was %d", r.Rank, r.Pid, pids[r.Rank])
		}
	}
	c.CheckRestored("ring", 1, m.Seq, testutil.RingOutput)
	var got []string
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		got = postCopyDone.FindStringSubmatch(c.AgentLog(free))
		return got != nil, "the target never had every page of rank 1"
	})
	if seq, _ := strconv.Atoi(got[1]); seq != m.Seq {
		t.Fatalf("every page of checkpoint %s arrived, want the migration's %d", got[1], m.Seq)
	}
	if pages, _ := strconv.Atoi(got[2]); pages < postCopyBallast<<20/4096 {
		t.Errorf("the target's page server served %d pages, want at least the ballast's %d", pages, postCopyBallast<<20/4096)
	}
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(c.AgentLog(place[1]), "post-copy migration: the target has every page; the source's pages are dropped"),
			"the source never dropped its pages"
	})
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	if j := c.Job("ring"); j.Restarts != 0 {
		t.Errorf("the job restarted %d times", j.Restarts)
	}
}

// TestPostCopySourceDies: the source of a post-copy migration stops
// serving pages once the rank has gone from it (the failpoint
// donor-pages), with most of the ballast not yet on the target, and its
// node is killed there. The moved rank cannot run on with memory that
// never comes: it is killed, and the job restarts from its checkpoint
// and finishes with the uninterrupted run's result.
func TestPostCopySourceDies(t *testing.T) {
	const messages = 1_500_000
	c, place, free := ballastRing(t, messages)
	source := place[1]
	armed := filepath.Join(t.TempDir(), "armed")
	if err := os.WriteFile(armed, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c.RestartAgent(source, failpoint.Env+"=donor-pages", failpoint.ArmedEnv+"="+armed)
	m := c.Migrate("ring/1", "--to", free, "--post-copy")
	if m.State != "done" || !m.PostCopy {
		t.Fatalf("post-copy migration: %+v", m)
	}
	testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
		return strings.Contains(c.AgentLog(source), "failpoint=donor-pages"), "the source never held a page request"
	})
	if postCopyDone.MatchString(c.AgentLog(free)) {
		t.Fatal("every page had arrived before the source held")
	}
	c.KillNodes([]string{source}, true)
	testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
		return strings.Contains(c.AgentLog(free), "post-copy migration failed: the rank is killed"),
			fmt.Sprintf("the target did not give the rank up:\n%s", tail(c.AgentLog(free), 20))
	})
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		j := c.Job("ring")
		return j.Restarts > 0 && j.State == "running", fmt.Sprintf("the job was not restarted after the source died: %+v", j)
	})
	c.ReleaseRing("ring") // restored from before its first release
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	c.CheckRestarted("ring", 1, testutil.RingOutput)
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestDrainPostCopy: `cairn drain --post-copy` moves the node's rank off
// it post-copy and marks the node drained; the node gives up the rank's
// pages once the target has them all, no new rank goes there until it is
// undrained, and the job ends with the uninterrupted run's result.
func TestDrainPostCopy(t *testing.T) {
	const messages = 1_500_000
	c, place, free := ballastRing(t, messages)
	var res coordv1.DrainResult
	if err := json.Unmarshal([]byte(c.OK("drain", place[1], "--post-copy", "--json")), &res); err != nil {
		t.Fatal(err)
	}
	if !res.Node.Drained || len(res.Migrations) != 1 {
		t.Fatalf("drain of %s: %+v", place[1], res)
	}
	if m := res.Migrations[0]; m.State != coordv1.MigrationDone || !m.PostCopy || m.Rank != 1 || m.To != free {
		t.Fatalf("the drain's migration: %+v", m)
	}
	c.ReleaseRing("ring")
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		return strings.Contains(c.AgentLog(place[1]), "post-copy migration: the target has every page; the source's pages are dropped"),
			"the drained node never gave up rank 1's pages"
	})
	if got := c.Status("ring").Placement; got[1] != free {
		t.Fatalf("rank 1 on %s after the drain, want %s", got[1], free)
	}
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	// Drained: a job asking for every node cannot be placed there.
	if out, err := c.Run("run", "--job", "more", "--ranks", "4", "--per-node", "1", "--", "/bin/true"); err == nil {
		t.Fatalf("a 4-rank job, one per node, ran with a node drained:\n%s", out)
	}
	c.OK("node", "undrain", place[1])
	c.OK("run", "--job", "more", "--ranks", "4", "--per-node", "1", "--", "/bin/true")
}
