package restore

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// lazyBallast is each rank's random memory in these tests: enough that
// its lazy restore is still going on when the test acts right after the
// restart.
const lazyBallast = 192

// lazyRing runs the ring job with both ranks on the cluster's first node
// (k=1, each rank holding lazyBallast MiB that it checks at the end),
// checkpoints it until protected, and kills it. extra goes to cairn run.
func lazyRing(t *testing.T, c *testutil.Cluster, messages int, extra ...string) testutil.Ckpt {
	t.Helper()
	args := []string{"run", "--job", "ring", "--ranks", "2", "--nodes", c.Nodes[0], "--replicas", "1", "--on-failure", "stop"}
	args = append(append(args, extra...), "--", c.Bin, "ringapp", "-messages", fmt.Sprint(messages), "-ballast", fmt.Sprint(lazyBallast))
	c.OK(args...)
	c.WaitProgress("ring", 2, 0, 90*time.Second)
	c.OK("checkpoint", "ring")
	ck := c.WaitProtected("ring", 2*time.Minute)
	c.OK("kill", "ring")
	return ck
}

// withoutCopy is a node that holds no copy of any rank image of ck, other
// than those of avoid.
func withoutCopy(t *testing.T, c *testutil.Cluster, ck testutil.Ckpt, avoid ...string) string {
	t.Helper()
	for _, n := range c.Nodes {
		held := slices.Contains(avoid, n)
		for _, r := range ck.Ranks {
			held = held || slices.Contains(r.Copies, n)
		}
		if !held {
			return n
		}
	}
	t.Fatalf("every node holds a copy of checkpoint %d: %+v", ck.Seq, ck.Ranks)
	return ""
}

// lazyDeadline is the round deadline of the lazy checkpoint tests'
// clusters. A round waits for a lazily restored rank's memory for three
// quarters of it: with the default (20 s, a 15 s wait), rounds under a
// loaded machine gave up before the memory came, and the round that then
// succeeded came after it, missing the window these tests are about.
var lazyDeadline = []string{"--deadline", "2m"}

// newest is the job's newest checkpoint.
func newest(t *testing.T, c *testutil.Cluster, job string) testutil.Ckpt {
	t.Helper()
	cks := c.Ckpts(job)
	if len(cks) == 0 {
		t.Fatalf("job %s has no checkpoint", job)
	}
	return cks[len(cks)-1]
}

// waitedForMemory says which ranks of ck waited for their lazily restored
// memory before their dump, and fails the test if none did: the round
// came after the lazy restores had ended, and the window this test is
// about was missed.
func waitedForMemory(t *testing.T, ck testutil.Ckpt) {
	t.Helper()
	var waited []string
	for _, r := range ck.Ranks {
		if r.MemoryWait > 0 {
			waited = append(waited, fmt.Sprintf("rank %d %v", r.Rank, r.MemoryWait))
		}
	}
	if len(waited) == 0 {
		t.Fatalf("no rank of checkpoint %d waited for its memory: the round missed the lazy restore's window (%+v)", ck.Seq, ck.Ranks)
	}
	t.Logf("checkpoint %d waited for lazily restored memory: %s", ck.Seq, strings.Join(waited, ", "))
}

// TestLazyCheckpoint: the ring job, both ranks on one node
// with 192 MiB of ballast each, is restarted lazily onto a node that
// holds no copy of its images, and checkpointed at once, while the ranks'
// memory is still arriving. The round waits for it (each rank's wait is
// in the checkpoint's record), and the checkpoint is whole: the job
// killed and restarted from it on its first node, then restarted lazily
// again and one rank migrated at once (the migration waits the same
// way), ends with exactly the uninterrupted run's result, every rank's
// ballast checked unchanged. Before the wait, such a checkpoint lacked
// the memory that had not arrived and restored into a crash.
func TestLazyCheckpoint(t *testing.T) {
	const messages = 3_000_000
	c := testutil.NewCluster(t, 5, lazyDeadline...)
	first := c.Nodes[0]
	ck1 := lazyRing(t, c, messages)

	// A round asked right after the lazy restart.
	lazyNode := withoutCopy(t, c, ck1)
	c.OK("restart", "ring", "--lazy", "--placement", lazyNode+","+lazyNode)
	c.OK("checkpoint", "ring")
	ck2 := newest(t, c, "ring")
	if ck2.Seq <= ck1.Seq || !ck2.Restorable() {
		t.Fatalf("checkpoint after the lazy restart: %+v, want a restorable one after %d", ck2, ck1.Seq)
	}
	waitedForMemory(t, ck2)
	c.WaitAgentLog(lazyNode, "prepare waited for the memory of a lazy restore", 10*time.Second)
	c.OK("kill", "ring")
	c.OK("restart", "ring", "--from", fmt.Sprint(ck2.Seq), "--lazy=false", "--placement", first+","+first)
	c.CheckRestarted("ring", ck2.Seq, testutil.RingOutput)

	// A migration of a rank right after a lazy restart.
	ck2 = c.WaitProtected("ring", 2*time.Minute)
	c.OK("kill", "ring")
	// Not where the chunks of checkpoint 1 are either: a node whose
	// store has most of the image's chunks restores it lazily in no time.
	avoid := []string{lazyNode}
	for _, r := range ck1.Ranks {
		avoid = append(avoid, r.Copies...)
	}
	again := withoutCopy(t, c, ck2, avoid...)
	c.OK("restart", "ring", "--from", fmt.Sprint(ck2.Seq), "--lazy", "--placement", again+","+again)
	to := lazyNode
	if to == again {
		to = first
	}
	m := c.Migrate("ring/1", "--to", to)
	if m.State != "done" {
		t.Fatalf("migration of rank 1 during its lazy restore: %+v", m)
	}
	if m.MemoryWait <= 0 {
		t.Fatalf("the migration did not wait for rank 1's lazily restored memory (%+v): it missed the window", m)
	}
	t.Logf("the migration waited %v for rank 1's memory", m.MemoryWait)

	if got, want := c.Result("ring"), ringapp.Expected(2, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
}

// TestLazyPeriodicCheckpoint: the ring job takes a checkpoint every 2 s;
// restarted lazily onto a node without its images, its next periodic
// round falls while the ranks' memory is still arriving, waits for it,
// and is whole: the job restarted from it on its first node ends with
// exactly the uninterrupted run's result, every rank's ballast checked.
func TestLazyPeriodicCheckpoint(t *testing.T) {
	const messages = 3_000_000
	c := testutil.NewCluster(t, 3, lazyDeadline...)
	first := c.Nodes[0]
	// Rank 0 holds near the end until released: the run must still be
	// going when the periodic round after the lazy restart comes.
	c.OK("run", "--job", "ring", "--ranks", "2", "--nodes", first, "--replicas", "0", "--on-failure", "stop", "--checkpoint-every", "2s",
		"--", c.Bin, "ringapp", "-messages", fmt.Sprint(messages), "-ballast", fmt.Sprint(lazyBallast), "-hold", fmt.Sprint(messages-1000))
	c.WaitProgress("ring", 2, 0, 90*time.Second)
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		cks := c.Ckpts("ring")
		return len(cks) > 0 && cks[len(cks)-1].Restorable(), "no periodic checkpoint yet"
	})
	c.OK("kill", "ring")
	var ck1 testutil.Ckpt
	for _, ck := range c.Ckpts("ring") {
		if ck.Restorable() {
			ck1 = ck
		}
	}
	lazyNode := withoutCopy(t, c, ck1)
	c.OK("restart", "ring", "--from", fmt.Sprint(ck1.Seq), "--lazy", "--placement", lazyNode+","+lazyNode)
	var ck testutil.Ckpt
	testutil.WaitUntil(t, 3*time.Minute, func() (bool, string) {
		for _, k := range c.Ckpts("ring") {
			if k.Seq > ck1.Seq && k.Restorable() {
				ck = k
				return true, ""
			}
		}
		return false, "no periodic checkpoint after the lazy restart"
	})
	waitedForMemory(t, ck)
	c.OK("kill", "ring")
	c.OK("restart", "ring", "--from", fmt.Sprint(ck.Seq), "--lazy=false", "--placement", first+","+first)
	c.ReleaseRing("ring")
	c.CheckRestarted("ring", ck.Seq, testutil.RingOutput)
	if got, want := c.Result("ring"), ringapp.Expected(2, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
}
