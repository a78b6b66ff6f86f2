package failover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// damageChunk flips a byte in the stored blob of a chunk of a CRIU page
// image of checkpoint seq of container name on node, the first from the
// n-th on that is not damaged yet and that the store of node lacks lacks
// (if lacks is given), and returns the chunk's id.
func damageChunk(t *testing.T, c *testutil.Cluster, node, name string, seq, n int, lacks string) store.ID {
	t.Helper()
	repo := c.Repo(node)
	rec, err := repo.Load(name, seq)
	if err != nil {
		t.Fatal(err)
	}
	st, err := repo.OpenReader()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := st.LoadManifest(context.Background(), rec.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	var ids []store.ID
	for _, nd := range m.Nodes {
		if strings.HasPrefix(nd.Path, image.CRIUDir+"/pages-") {
			ids = append(ids, nd.Chunks...)
		}
	}
	for i, id := range ids {
		if i < n {
			continue
		}
		if lacks != "" {
			missing, err := c.Repo(lacks).Missing(context.Background(), []store.ID{id})
			if err != nil {
				t.Fatal(err)
			}
			if len(missing) == 0 {
				continue
			}
		}
		// A chunk damaged by an earlier call (pages repeat, and calls
		// from nearby n find the same chunk) is left alone: a second
		// flip would mend it.
		if _, err := st.Get(context.Background(), id); errors.Is(err, store.ErrCorrupt) {
			continue
		}
		path, off, length, ok := store.Locate(st, id)
		if !ok {
			t.Fatalf("chunk %s of %s:%d not in %s's store", id.Short(), name, seq, node)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b[off+int64(length)/2] ^= 0x5a
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Get(context.Background(), id); !errors.Is(err, store.ErrCorrupt) {
			// Say whether the flip is still on disk, and where the store
			// finds the chunk now, so that a store that misses damage is
			// told from a pack rewritten under the test.
			now, rerr := os.ReadFile(path)
			still := rerr == nil && int64(len(now)) > off+int64(length)/2 && now[off+int64(length)/2] == b[off+int64(length)/2]
			p2, off2, len2, ok2 := store.Locate(st, id)
			t.Fatalf("chunk %s damaged at %s+%d (length %d) reads as %v; the flip is still there: %v (%v); the store finds it at %s+%d (length %d, %v)",
				id.Short(), path, off+int64(length)/2, length, err, still, rerr, p2, off2, len2, ok2)
		}
		return id
	}
	t.Fatalf("%s:%d has no page chunk from the %d-th on that %q lacks", name, seq, n, lacks)
	return store.ID{}
}

// TestDamagedCopy: a chunk of a rank image is damaged on disk. A restart
// that restores the rank where the damaged copy is detects it before CRIU
// runs, replaces the damaged chunk from another copy and finishes with the
// right result; a restart that fetches from the damaged copy and another
// at once gets the damaged copy's share from the other copy, and the
// damaged source is repaired. Each rank holds 16 MiB of ballast, so that
// the image is fetched in at least four shares and both copies are asked
// for one at once.
func TestDamagedCopy(t *testing.T) {
	const messages = 1_500_000
	// Step 1 restores where the checkpoint was taken: an image kept in
	// staging would be used instead of the damaged store.
	t.Setenv("CAIRN_KEEP_IMAGES", "0")
	c := testutil.NewCluster(t, 4)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "3", "--per-node", "1", "--replicas", "1"}, append(c.RingArgs(messages), "-ballast", "16")...)...)
	place := c.Status("ring").Placement
	c.WaitProgress("ring", 3, 0, 60*time.Second)
	c.OK("checkpoint", "ring")
	ck := c.WaitProtected("ring", 60*time.Second)
	home := place[1]
	var replica string
	for _, n := range ck.Ranks[1].Copies {
		if n != home {
			replica = n
		}
	}
	var other string // a node with no copy of rank 1, and no rank if possible
	for _, n := range c.Nodes {
		if n != home && n != replica && (other == "" || !slices.Contains(place, n)) {
			other = n
		}
	}
	name := "ring.1"

	// 1. Restore where the damaged copy is: detected, repaired, restored.
	bad := damageChunk(t, c, home, name, ck.Seq, 3, "")
	c.OK("restart", "ring")
	if p := c.Status("ring").Placement; p[1] != home {
		t.Fatalf("rank 1 restarted on %s, want %s where its copy is", p[1], home)
	}
	log := c.CoordinatorLog()
	for _, want := range []string{
		"damaged image at restore; repairing it from another copy",
		fmt.Sprintf(`msg="damaged copy repaired" job=ring ckpt=%d rank=1 node=%s peer=%s chunks=1`, ck.Seq, home, replica),
	} {
		if !strings.Contains(log, want) {
			t.Fatalf("coordinator log lacks %q:\n%s", want, log)
		}
	}
	checkIntact(t, c, home, name, ck.Seq, bad)
	c.CheckRestarted("ring", ck.Seq, testutil.RingOutput)

	// 2. Restore elsewhere from the stream of the damaged copy and the
	// good one: a page in every 256 that the target lacks is damaged, so
	// whatever share the damaged copy is asked for fails; the good copy
	// sends it instead, and the damaged source is repaired afterwards (the
	// coordinator told so by the restore's reply).
	var bads []store.ID
	for i := 5; i < 4096; i += 256 {
		bads = append(bads, damageChunk(t, c, home, name, ck.Seq, i, other))
	}
	c.OK("restart", "ring", "--placement", strings.Join([]string{place[0], other, place[2]}, ","))
	if p := c.Status("ring").Placement; p[1] != other {
		t.Fatalf("rank 1 restarted on %s, want %s", p[1], other)
	}
	// Restored from the stream; its node's store fetches the copy after.
	testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
		return strings.Contains(c.CoordinatorLog(), fmt.Sprintf(`msg="fetched for restart" job=ring ckpt=%d rank=1 node=%s`, ck.Seq, other)),
			fmt.Sprintf("%s never stored its copy of rank 1", other)
	})
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		n := strings.Count(c.CoordinatorLog(), fmt.Sprintf(`msg="damaged copy repaired" job=ring ckpt=%d rank=1 node=%s`, ck.Seq, home))
		return n == 2, fmt.Sprintf("%d repairs of rank 1's copy on %s logged, want 2", n, home)
	})
	for _, bad := range bads {
		checkIntact(t, c, home, name, ck.Seq, bad)
		checkIntact(t, c, other, name, ck.Seq, bad)
	}

	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	c.CheckRestarted("ring", ck.Seq, testutil.RingOutput)
}

// checkIntact checks that a node's copy of a checkpoint reads back whole,
// chunk id included.
func checkIntact(t *testing.T, c *testutil.Cluster, node, name string, seq int, id store.ID) {
	t.Helper()
	repo := c.Repo(node)
	if _, err := repo.Verify(context.Background(), name, seq, true, nil); err != nil {
		t.Fatalf("%s's copy of %s:%d after repair: %v", node, name, seq, err)
	}
	st, err := repo.OpenReader()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Get(context.Background(), id); err != nil {
		t.Fatalf("chunk %s on %s after repair: %v", id.Short(), node, err)
	}
}

// TestNodeDiesMidReplication: the node receiving a rank's replica dies
// (its agent killed, its disk kept) halfway through the copy, some of its
// chunks stored. The checkpoint is never protected without its copies on
// live nodes, and the lost copy is made again elsewhere. Then the node
// holding that rank's original dies with its disk, and the first node
// comes back with what it had received: not recorded, not listed, not
// whole. A restart that puts the rank there must restore it, and does so
// from a complete copy fetched from the live holders (only what the node
// lacked), never from what was half received. Each rank holds 40 MiB of
// ballast, so that its image fills more than one pack (16 MiB): the first
// is stored on the receiver while the rest streams in, rate-limited.
func TestNodeDiesMidReplication(t *testing.T) {
	const messages = 1_500_000
	c := testutil.NewCluster(t, 4)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "3", "--per-node", "1", "--replicas", "1", "--replication-rate", "2M", "--on-failure", "stop"},
		append(c.RingArgs(messages), "-ballast", "40")...)...)
	place := c.Status("ring").Placement
	idle := c.Unused(place)
	c.WaitProgress("ring", 3, 0, 60*time.Second)
	c.OK("checkpoint", "ring")
	// The idle node receives one rank's replica: wait until its store
	// holds a good part of that image, then kill the node.
	images := make([][]store.ID, len(place))
	for r, n := range place {
		images[r] = imageChunks(t, c, n, fmt.Sprintf("ring.%d", r), 1)
	}
	// Only each image's own chunks tell whose copy arrives: the ranks
	// share chunks (the program, the libraries), which a copy of one
	// brings for the others too.
	own := ownChunks(images)
	rank := -1
	testutil.WaitUntil(t, time.Minute, func() (bool, string) {
		held := make([]int, len(own))
		for r, ids := range own {
			missing, err := c.Repo(idle).Missing(context.Background(), ids)
			if err != nil {
				t.Fatal(err)
			}
			// A quarter to three quarters: at 2 MB/s, seconds before the
			// copy ends, for the checks below to see it unfinished.
			if held[r] = len(ids) - len(missing); held[r] >= len(ids)/4 && held[r] <= len(ids)*3/4 {
				rank = r
			}
		}
		return rank >= 0, fmt.Sprintf("%s holds %v of the ranks' own chunks, want a quarter to three quarters of one's", idle, held)
	})
	ck := c.Ckpts("ring")[0]
	if ck.State == "protected" {
		t.Fatalf("checkpoint protected while a copy is still arriving: %+v", ck.Ranks)
	}
	restartIdle := c.KillAgent(idle)
	t.Logf("killed %s while it received a replica of rank %d", idle, rank)
	// Its replication to the node failed.
	var cut []int
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		cut = nil
		for _, e := range c.Events("--type", "replica.failed") {
			if e.Node == idle && e.Ckpt == ck.Seq && e.Rank != nil {
				cut = append(cut, *e.Rank)
			}
		}
		return len(cut) > 0, "no failed replication to " + idle
	})
	if cut = slices.Compact(slices.Sorted(slices.Values(cut))); !slices.Equal(cut, []int{rank}) {
		t.Fatalf("replications of ranks %v to %s failed, want rank %d's", cut, idle, rank)
	}
	name := fmt.Sprintf("ring.%d", rank)
	origin := place[rank]
	t.Logf("%s's copy of rank %d (from %s) was cut short", idle, rank, origin)

	// Until the copy is made again elsewhere the checkpoint is durable; once
	// protected, every rank has 2 copies and none is the killed node's.
	testutil.WaitUntil(t, 3*time.Minute, func() (bool, string) {
		ck = c.Ckpts("ring")[0]
		for r, rk := range ck.Ranks {
			if slices.Contains(rk.Copies, idle) {
				t.Fatalf("rank %d's copy on %s was recorded though it was cut short: %v", r, idle, rk.Copies)
			}
			if ck.State == "protected" && len(rk.Copies) < 2 {
				t.Fatalf("checkpoint protected with rank %d on %v only", r, rk.Copies)
			}
		}
		return ck.State == "protected", fmt.Sprintf("checkpoint %s: %+v", ck.State, ck.Ranks)
	})
	remade := ck.Ranks[rank].Copies[1] // the copy made after the cut
	chunks := imageChunks(t, c, remade, name, ck.Seq)
	if d := cmp.Diff(images[rank], chunks); d != "" {
		t.Fatalf("%s's copy of %s:%d is not the original's:\n%s", remade, name, ck.Seq, d)
	}

	// The rank's original goes with its node: the copies made after the
	// cut are all that is left of its image. The checkpoint gets its two
	// copies back on the two live nodes before the half-filled node returns.
	c.KillNode(origin, true)
	c.WaitNodes(2, time.Minute)
	testutil.WaitUntil(t, 3*time.Minute, func() (bool, string) {
		ck = c.Ckpts("ring")[0]
		for _, rk := range ck.Ranks {
			live := slices.DeleteFunc(slices.Clone(rk.Copies), func(n string) bool { return n == origin || n == idle })
			if len(live) < 2 {
				return false, fmt.Sprintf("checkpoint %s, rank %d on %v, want 2 copies besides %s", ck.State, rk.Rank, rk.Copies, origin)
			}
		}
		return ck.State == "protected", fmt.Sprintf("checkpoint %s: %+v", ck.State, ck.Ranks)
	})

	// The node comes back: what it received in part is not a checkpoint.
	restartIdle()
	c.WaitNodes(3, 30*time.Second)
	for r := range 3 {
		if _, err := c.Repo(idle).Load(fmt.Sprintf("ring.%d", r), ck.Seq); err == nil {
			t.Fatalf("%s's store has a record of ring.%d:%d, which it received only in part", idle, r, ck.Seq)
		}
		if _, ok := nodeChunks(t, c, idle, fmt.Sprintf("ring.%d", r), ck.Seq); ok {
			t.Fatalf("%s's agent lists ring.%d:%d, which it received only in part", idle, r, ck.Seq)
		}
	}
	missing, err := c.Repo(idle).Missing(context.Background(), chunks)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) == 0 || len(missing) == len(chunks) {
		t.Fatalf("%s lacks %d of the %d chunks of %s:%d, want part of them", idle, len(missing), len(chunks), name, ck.Seq)
	}
	t.Logf("%s holds %d of the %d chunks of %s:%d", idle, len(chunks)-len(missing), len(chunks), name, ck.Seq)
	if ck := c.Ckpts("ring")[0]; slices.Contains(ck.Ranks[rank].Copies, idle) {
		t.Fatalf("%s's partial copy of %s:%d is recorded: %v", idle, name, ck.Seq, ck.Ranks[rank].Copies)
	}

	// The restart puts the rank on that node: it is restored from the
	// stream of the live copies' chunks (those the node holds read from
	// its store), and the node's store then fetches the image whole.
	moved := slices.Clone(place)
	moved[rank] = idle
	c.OK("restart", "ring", "--placement", strings.Join(moved, ","))
	var log string
	var m []string
	testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
		log = c.CoordinatorLog()
		m = regexp.MustCompile(`msg="fetched for restart" job=ring ckpt=\d+ rank=` + fmt.Sprint(rank) + ` node=` + regexp.QuoteMeta(idle) + ` peer=(\S+) bytes=(\d+)`).FindStringSubmatch(log)
		return m != nil, fmt.Sprintf("no fetch of rank %d onto %s after the restart in the coordinator's log", rank, idle)
	})
	for _, from := range strings.Split(m[1], ",") {
		if from == `""` || from == idle || from == origin || !slices.Contains(ck.Ranks[rank].Copies, from) {
			t.Fatalf("rank %d's image was fetched onto %s from %s, want from its live copies %v", rank, idle, m[1], ck.Ranks[rank].Copies)
		}
	}
	// What had arrived was kept as chunks and not sent again: less than
	// the whole copy made after the cut.
	// (A copy that found the image there already names no peer.)
	whole := regexp.MustCompile(`msg=replicated job=ring ckpt=1 rank=` + fmt.Sprint(rank) + ` node=` + regexp.QuoteMeta(remade) + ` peer=[^"\s]\S* bytes=(\d+)`).FindStringSubmatch(log)
	if whole == nil {
		t.Fatalf("no replication of rank %d to %s in the coordinator's log", rank, remade)
	}
	fetched, full := atoi(t, m[2]), atoi(t, whole[1])
	if fetched >= full {
		t.Fatalf("the restart fetched %d bytes of rank %d's image onto %s, the whole copy to %s took %d: the chunks it held were sent again", fetched, rank, idle, remade, full)
	}
	t.Logf("the restart fetched %d bytes onto %s from %s; the whole copy to %s took %d", fetched, idle, m[1], remade, full)
	ids, ok := nodeChunks(t, c, idle, name, ck.Seq)
	if !ok {
		t.Fatalf("%s does not list %s:%d after the restart", idle, name, ck.Seq)
	}
	if d := cmp.Diff(storeIDs(chunks), ids); d != "" {
		t.Fatalf("%s's copy of %s:%d is not %s's (-%s +%s):\n%s", idle, name, ck.Seq, remade, remade, idle, d)
	}
	if _, err := c.Repo(idle).Verify(context.Background(), name, ck.Seq, true, nil); err != nil {
		t.Fatalf("%s:%d on %s after the restart: %v", name, ck.Seq, idle, err)
	}
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	c.CheckRestarted("ring", ck.Seq, testutil.RingOutput)
}

// TestQuarantineEvent damages a pack no index lists in a node's store (a
// copy of a real pack under another name, one byte flipped): the next
// checkpoint's store writer on that node quarantines it instead of deleting
// it, the checkpoint still becomes durable, and the cluster's event stream
// says so once, naming the node and the pack.
func TestQuarantineEvent(t *testing.T) {
	c := testutil.NewCluster(t, 1)
	c.OK("run", "--job", "q", "--ranks", "1", "--replicas", "0", "--", "sleep", "600")
	c.OK("checkpoint", "q")
	node := c.Status("q").Placement[0]
	var data string
	for _, n := range c.File().Nodes {
		if n.Name == node {
			data = n.Data
		}
	}
	packs, _ := filepath.Glob(filepath.Join(data, "store", "packs", "*", "*"))
	if len(packs) == 0 {
		t.Fatal("no pack on the node")
	}
	b, err := os.ReadFile(packs[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 0x40
	name := strings.Repeat("ab", 32)
	bad := filepath.Join(data, "store", "packs", "ab", name)
	if err := os.MkdirAll(filepath.Dir(bad), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c.OK("checkpoint", "q")
	if cks := c.Ckpts("q"); len(cks) != 2 || cks[1].State != "durable" && cks[1].State != "protected" {
		t.Fatalf("checkpoints after the quarantine: %+v", cks)
	}
	if _, err := os.Stat(filepath.Join(data, "store", "quarantine", name)); err != nil {
		t.Fatalf("the damaged pack is not in quarantine: %v", err)
	}
	var events string
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		events = c.OK("events", "--type", "store.quarantined", "--json")
		return strings.Contains(events, name[:12]), events
	})
	if n := strings.Count(events, `"store.quarantined"`); n != 1 || !strings.Contains(events, node) {
		t.Fatalf("want one event naming %s, got %d:\n%s", node, n, events)
	}
	time.Sleep(3 * time.Second) // more heartbeats: still one event
	if n := strings.Count(c.OK("events", "--type", "store.quarantined", "--json"), `"store.quarantined"`); n != 1 {
		t.Fatalf("%d quarantine events after more heartbeats", n)
	}
	c.OK("rm", "-f", "q")
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ownChunks returns, of each image's chunks, those no other image has.
func ownChunks(images [][]store.ID) [][]store.ID {
	count := map[store.ID]int{}
	for _, ids := range images {
		for _, id := range slices.Compact(slices.SortedFunc(slices.Values(ids), func(a, b store.ID) int { return bytes.Compare(a[:], b[:]) })) {
			count[id]++
		}
	}
	out := make([][]store.ID, len(images))
	for r, ids := range images {
		for _, id := range ids {
			if count[id] == 1 {
				out[r] = append(out[r], id)
			}
		}
	}
	return out
}
