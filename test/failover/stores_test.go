package failover

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// nodeChunks asks node's agent for the checkpoints of container it holds
// and the chunk list of seq's image; ok is false if the agent does not
// list that checkpoint.
func nodeChunks(t *testing.T, c *testutil.Cluster, node, container string, seq int) (ids []string, ok bool) {
	t.Helper()
	ag := c.Agent(node)
	defer ag.Close()
	ctx := context.Background()
	cks, err := ag.Checkpoints(ctx, container)
	if err != nil {
		t.Fatalf("checkpoints of %s on %s: %v", container, node, err)
	}
	if !slices.ContainsFunc(cks, func(ck agentv1.Checkpoint) bool { return ck.Seq == seq }) {
		return nil, false
	}
	ids, err = ag.Chunks(ctx, container, seq)
	if err != nil {
		t.Fatalf("chunks of %s:%d on %s: %v", container, seq, node, err)
	}
	return ids, true
}

// checkCopiesStored checks on the nodes themselves every copy of the
// job's checkpoints that the coordinator records on a live node (not in
// dead): the node's agent lists the checkpoint and its chunks, the same as
// every other copy's, and the node's store holds the image whole, every
// chunk read back and verified against its id. It returns how many copies
// it checked.
func checkCopiesStored(t *testing.T, c *testutil.Cluster, job string, dead []string) int {
	t.Helper()
	n := 0
	for _, ck := range c.Ckpts(job) {
		for _, rk := range ck.Ranks {
			name := fmt.Sprintf("%s.%d", job, rk.Rank)
			var first []string
			var firstNode string
			for _, node := range rk.Copies {
				if slices.Contains(dead, node) {
					continue
				}
				ids, ok := nodeChunks(t, c, node, name, ck.Seq)
				if !ok {
					t.Fatalf("%s's agent does not list %s:%d, a copy the coordinator records there (copies %v)", node, name, ck.Seq, rk.Copies)
				}
				if len(ids) == 0 {
					t.Fatalf("%s's copy of %s:%d has no chunks", node, name, ck.Seq)
				}
				if first == nil {
					first, firstNode = ids, node
				} else if d := cmp.Diff(first, ids); d != "" {
					t.Fatalf("the copies of %s:%d on %s and %s differ (-%s +%s):\n%s", name, ck.Seq, firstNode, node, firstNode, node, d)
				}
				if _, err := c.Repo(node).Verify(context.Background(), name, ck.Seq, true, nil); err != nil {
					t.Fatalf("%s's copy of %s:%d: %v", node, name, ck.Seq, err)
				}
				n++
			}
		}
	}
	return n
}

// imageChunks is the chunk list of a node's copy of an image, read from
// its store.
func imageChunks(t *testing.T, c *testutil.Cluster, node, container string, seq int) []store.ID {
	t.Helper()
	ids, err := c.Repo(node).ChunkIDs(context.Background(), container, seq)
	if err != nil {
		t.Fatalf("chunks of %s:%d on %s: %v", container, seq, node, err)
	}
	return ids
}

// storeIDs is ids as the agent API lists them.
func storeIDs(ids []store.ID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.String()
	}
	return out
}
