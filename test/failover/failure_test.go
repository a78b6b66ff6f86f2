package failover

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// testNodeLoss runs the ring on 4 of 5 nodes (the fifth a spare) with k
// replicas, checkpoints it, then kills the nodes of the given ranks with
// their data: the job must restart by itself from the replicas, the lost
// ranks on the spare first, go on from the newest checkpoint and finish
// with an uninterrupted run's result; afterwards the checkpoints are back
// to k copies on live nodes, without a new checkpoint, and each copy is
// whole in its node's store.
func testNodeLoss(t *testing.T, k int, lose []int) {
	const messages = 1_500_000
	c := testutil.NewCluster(t, 5)
	spare := c.Nodes[4]
	c.OK("node", "spare", spare)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "4", "--replicas", fmt.Sprint(k)}, c.RingArgs(messages)...)...)
	before := c.Status("ring").Placement
	if slices.Contains(before, spare) {
		t.Fatalf("a rank was placed on the spare: %v", before)
	}
	c.WaitProgress("ring", 4, 0, 60*time.Second)
	c.OK("checkpoint", "ring")
	ck := c.WaitProtected("ring", 60*time.Second)
	for _, r := range ck.Ranks {
		if len(r.Copies) != 1+k || len(slices.Compact(slices.Sorted(slices.Values(r.Copies)))) != 1+k {
			t.Fatalf("rank image on %s has copies %v, want %d distinct", r.Node, r.Copies, 1+k)
		}
	}
	// Only what a replica lacks crosses the network: a second checkpoint
	// shares most chunks with the first, and the ranks' images share many
	// among themselves (so the first's copies are small too, and the ring's
	// few changed pages can make the second's as large as the first's; a
	// comparison of the two failed so). A whole stream would move the
	// images' size.
	c.OK("checkpoint", "ring")
	ck2 := c.WaitProtected("ring", 60*time.Second)
	first, second := replicatedBytes(t, c, 1), replicatedBytes(t, c, 2)
	var size int64
	for _, r := range ck2.Ranks {
		size += r.Size
	}
	t.Logf("replication moved %d bytes for checkpoint 1, %d for checkpoint 2 (of %d in its images)", first, second, size)
	if second*2 > size*int64(k) {
		t.Errorf("checkpoint 2's replication moved %d bytes for %d copies of %d bytes of images: want only the chunks the replicas lacked sent", second, k, size)
	}
	copiesBefore := map[int][][]string{} // by checkpoint, by rank
	for _, ck := range c.Ckpts("ring") {
		for _, r := range ck.Ranks {
			copiesBefore[ck.Seq] = append(copiesBefore[ck.Seq], r.Copies)
		}
	}
	var dead []string
	for _, r := range lose {
		dead = append(dead, before[r])
	}
	start := time.Now()
	c.KillNodes(dead, true)
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		j := c.Job("ring")
		onDead := slices.ContainsFunc(j.Placement, func(n string) bool { return slices.Contains(dead, n) })
		return j.Restarts >= 1 && j.State == "running" && !onDead,
			fmt.Sprintf("job %s on %v, %d restarts (%s)", j.State, j.Placement, j.Restarts, j.Reason)
	})
	t.Logf("job restarted by itself %s after its nodes %v died", time.Since(start).Round(100*time.Millisecond), dead)
	after := c.Job("ring").Placement
	for _, r := range lose {
		if slices.Contains(dead, after[r]) {
			t.Fatalf("rank %d restarted on dead node %s", r, after[r])
		}
	}
	if !slices.Contains(after, spare) {
		t.Fatalf("no rank restarted on the spare %s: %v", spare, after)
	}
	if got, want := c.Result("ring"), ringapp.Expected(4, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	// From the newest checkpoint, complete on the live nodes.
	c.CheckRestarted("ring", 2, testutil.RingOutput)
	// Repair: every checkpoint kept has its copies again, all on live
	// nodes, without a new checkpoint.
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		cks := c.Ckpts("ring")
		for _, ck := range cks {
			if ck.State != "protected" {
				return false, fmt.Sprintf("checkpoint %d is %s after the repair", ck.Seq, ck.State)
			}
		}
		return len(cks) == 2, fmt.Sprintf("%d checkpoints", len(cks))
	})
	made := 0 // copies on nodes that did not hold them before the loss
	for _, ck := range c.Ckpts("ring") {
		for i, r := range ck.Ranks {
			live := 0
			for _, n := range r.Copies {
				if !slices.Contains(dead, n) {
					live++
				}
				if !slices.Contains(copiesBefore[ck.Seq][i], n) {
					made++
				}
			}
			if live < 1+k {
				t.Fatalf("after repair a rank image of checkpoint %d has %d live copies (%v), want %d", ck.Seq, live, r.Copies, 1+k)
			}
		}
	}
	if made == 0 {
		t.Fatal("the catalog records no copy made after the loss")
	}
	// The catalog is only the coordinator's word: every copy it records is
	// on its node, listed by its agent and whole in its store.
	checked := checkCopiesStored(t, c, "ring", dead)
	t.Logf("after the repair, %d copies on live nodes (%d made since the loss) are in their nodes' stores, every chunk verified", checked, made)
}

var replicatedRE = regexp.MustCompile(`msg=replicated job=ring ckpt=(\d+) rank=\d+ node=\S+ peer=\S+ bytes=(\d+)`)

// replicatedBytes sums what the coordinator logged as sent to replicate
// checkpoint seq of the ring.
func replicatedBytes(t *testing.T, c *testutil.Cluster, seq int) int64 {
	t.Helper()
	var n int64
	for _, m := range replicatedRE.FindAllStringSubmatch(c.CoordinatorLog(), -1) {
		if s, _ := strconv.Atoi(m[1]); s == seq {
			v, _ := strconv.ParseInt(m[2], 10, 64)
			n += v
		}
	}
	if n == 0 {
		t.Fatalf("no replication of checkpoint %d in the coordinator's log", seq)
	}
	return n
}

// TestNodeLossRestart: k=1, the node of one rank dies with its disk.
func TestNodeLossRestart(t *testing.T) { testNodeLoss(t, 1, []int{1}) }

// TestTwoNodesLost: k=2, two nodes die at once with their disks.
func TestTwoNodesLost(t *testing.T) { testNodeLoss(t, 2, []int{1, 2}) }
