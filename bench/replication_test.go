package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/zeebo/blake3"
	"golang.org/x/sync/errgroup"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

var fetchedRE = regexp.MustCompile(`msg="fetched for restart" job=mem ckpt=\d+ rank=0 node=\S+ peer=\S+ bytes=\d+ took=(\S+)`)

var replLogRE = regexp.MustCompile(`msg=replicated job=(\S+) ckpt=(\d+) rank=\d+ node=\S+ peer=\S+ bytes=(\d+) took=(\S+)`)

// BenchmarkReplication measures replication between two nodes of a local
// cluster next to raw TCP between the same two nodes in the same run: a
// 1-rank job holding CAIRN_BENCH_REPL_MIB (default 512) MiB of random
// memory is checkpointed, and its image (incompressible, so every byte
// travels) is copied to the other node: fetched over the agent API,
// verified chunk by chunk and stored. The baseline is the slowest of the
// three stages a transfer pipelines, each measured in the same run: one
// TCP stream of the same size between the two nodes' namespaces, the
// sender's store reading the image's chunks (every core), and a fresh
// store on the receiver's disk verifying and writing them (every core).
func BenchmarkReplication(b *testing.B) {
	mib := envInt("CAIRN_BENCH_REPL_MIB", 512)
	c := testutil.NewCluster(b, 2)
	c.OK("run", "--job", "mem", "--ranks", "1", "--nodes", c.Nodes[0], "--", c.Bin, "stateapp", "-no-stream", "-mem", strconv.Itoa(mib), "-dirty-every", "0", "-dir", "/var/lib/stateapp")
	time.Sleep(time.Duration(mib/64+2) * time.Second) // the memory is written
	c.OK("checkpoint", "mem")
	var bytes int64
	var took time.Duration
	testutil.WaitUntil(b, 10*time.Minute, func() (bool, string) {
		log, _ := os.ReadFile(filepath.Join(c.Data, "cluster", "coordinator", "coordinator.log"))
		for _, m := range replLogRE.FindAllStringSubmatch(string(log), -1) {
			if m[1] == "mem" && m[2] == "1" {
				bytes, _ = strconv.ParseInt(m[3], 10, 64)
				took, _ = time.ParseDuration(m[4])
				return true, ""
			}
		}
		return false, "no replication of mem:1 logged"
	})
	repl := float64(bytes) / took.Seconds()

	// Raw TCP between the same two nodes.
	tcp := rawTCP(b, c, c.Nodes[0], c.Nodes[1], bytes)
	read, write := storeBounds(b, filepath.Join(c.Data, "cluster", "nodes", c.Nodes[0], "data"), filepath.Join(c.Data, "cluster", "nodes", c.Nodes[1], "data"))
	bound := min(tcp, read, write)
	b.Logf("replication of a %d MiB image between two nodes: %d bytes in %s = %.0f MiB/s | raw TCP between the same nodes: %.0f MiB/s | sender's read: %.0f MiB/s | receiver's verify+write: %.0f MiB/s | ratio to the slowest %.2f (target >= 0.8), to raw TCP %.2f",
		mib, bytes, took.Round(time.Millisecond), repl/(1<<20), tcp/(1<<20), read/(1<<20), write/(1<<20), repl/bound, repl/tcp)
	// The bare bounds of the receiver: its disk written and fsynced, and
	// BLAKE3 hashing over every core.
	disk := rawDiskWrite(b, filepath.Join(c.Data, "cluster", "nodes", c.Nodes[1], "data"), bytes)
	hash := blake3AllCores(bytes)
	b.Logf("receiver's bare bounds: disk write+fsync %.0f MiB/s, BLAKE3 over %d cores %.0f MiB/s", disk/(1<<20), runtime.NumCPU(), hash/(1<<20))
	record(b, atLeast("replica receive throughput ÷ the slower of disk write+fsync and BLAKE3 over every core", repl/min(disk, hash), 0.8,
		fmt.Sprintf("%.0f / min(%.0f, %.0f) MiB/s", repl/(1<<20), disk/(1<<20), hash/(1<<20))))
}

// rawDiskWrite writes n bytes of random data into a file in dir in 1 MiB
// writes, fsyncs it, and returns the bytes per second (median of 3).
func rawDiskWrite(b *testing.B, dir string, n int64) float64 {
	b.Helper()
	buf := make([]byte, 1<<20)
	rand.Read(buf)
	var rates []time.Duration
	for range 3 {
		p := filepath.Join(dir, "bench-raw-write")
		f, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		dropCaches()
		start := time.Now()
		for left := n; left > 0; left -= int64(len(buf)) {
			if _, err := f.Write(buf[:min(int64(len(buf)), left)]); err != nil {
				b.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		rates = append(rates, time.Since(start))
		f.Close()
		os.Remove(p)
	}
	return float64(n) / median(rates).Seconds()
}

// blake3AllCores hashes n bytes in 4 KiB pieces (a page: most of a
// rank image's chunks) on every core at once and returns the bytes per
// second (median of 3).
func blake3AllCores(n int64) float64 {
	piece := make([]byte, 4<<10)
	rand.Read(piece)
	cores := runtime.NumCPU()
	var took []time.Duration
	for range 3 {
		start := time.Now()
		var wg sync.WaitGroup
		for range cores {
			wg.Go(func() {
				for left := n / int64(cores); left > 0; left -= int64(len(piece)) {
					_ = blake3.Sum256(piece)
				}
			})
		}
		wg.Wait()
		took = append(took, time.Since(start))
	}
	return float64(n) / median(took).Seconds()
}

// storeBounds measures, in bytes per second of chunk streams, how fast
// the store in node data dir from reads the chunks of its one image (as
// chunk streams, every core) and how fast a fresh store in data dir to's
// file system verifies and writes them (every core, flushed).
func storeBounds(b *testing.B, from, to string) (read, write float64) {
	b.Helper()
	ctx := context.Background()
	repo := image.Repo{Dir: filepath.Join(from, "checkpoints"), StoreDir: filepath.Join(from, "store")}
	recs, _ := repo.All()
	if len(recs) == 0 {
		b.Fatal("no checkpoint on the sending node")
	}
	src, err := repo.OpenChunkSource(ctx, recs[0].Container, recs[0].Seq)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	ids, err := repo.ChunkIDs(ctx, recs[0].Container, recs[0].Seq)
	if err != nil {
		b.Fatal(err)
	}
	var shares [][]store.ID
	for len(ids) > 0 {
		n := min(1024, len(ids))
		shares = append(shares, ids[:n])
		ids = ids[n:]
	}
	streams := make([][]byte, len(shares))
	var total int64
	parallel := func(fn func(i int) error) time.Duration {
		start := time.Now()
		var g errgroup.Group
		g.SetLimit(runtime.NumCPU())
		for i := range shares {
			g.Go(func() error { return fn(i) })
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	took := parallel(func(i int) error {
		var buf bytes.Buffer
		err := src.Export(ctx, &buf, shares[i], store.ChunkStreamV2)
		streams[i] = buf.Bytes()
		return err
	})
	for _, s := range streams {
		total += int64(len(s))
	}
	dir, err := os.MkdirTemp(to, "bench-store-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	dst, err := store.Open(dir, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	took2 := parallel(func(i int) error {
		_, err := dst.ImportChunks(ctx, bytes.NewReader(streams[i]), shares[i])
		return err
	})
	start := time.Now()
	if err := dst.Close(); err != nil {
		b.Fatal(err)
	}
	took2 += time.Since(start)
	return float64(total) / took.Seconds(), float64(total) / took2.Seconds()
}

// rawTCP sends n bytes over one TCP connection from node from to node to
// and returns the throughput in bytes per second: the link a transfer
// between those nodes could have.
func rawTCP(b *testing.B, c *testutil.Cluster, from, to string, n int64) float64 {
	b.Helper()
	var ln net.Listener
	if err := netw.InNetns(netw.NetnsPath(to), func() (err error) {
		ln, err = net.Listen("tcp", "0.0.0.0:17500")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		k, _ := io.Copy(io.Discard, conn)
		conn.Close()
		got <- k
	}()
	var tcp float64
	buf := make([]byte, 1<<20)
	if err := netw.InNetns(netw.NetnsPath(from), func() error {
		conn, err := net.Dial("tcp", net.JoinHostPort(nodeAddr(b, c, to), "17500"))
		if err != nil {
			return err
		}
		start := time.Now()
		for sent := int64(0); sent < n; sent += int64(len(buf)) {
			if _, err := conn.Write(buf); err != nil {
				return err
			}
		}
		conn.(*net.TCPConn).CloseWrite()
		k := <-got
		tcp = float64(k) / time.Since(start).Seconds()
		return conn.Close()
	}); err != nil {
		b.Fatal(err)
	}
	return tcp
}

// nodeAddr is a node's underlay address.
func nodeAddr(b *testing.B, c *testutil.Cluster, node string) string {
	var nodes []struct {
		Name     string `json:"name"`
		Underlay string `json:"underlay"`
	}
	if err := jsonUnmarshal(c.OK("nodes", "--json"), &nodes); err != nil {
		b.Fatal(err)
	}
	for _, n := range nodes {
		if n.Name == node {
			return n.Underlay
		}
	}
	b.Fatalf("no node %s", node)
	return ""
}

func jsonUnmarshal(s string, v any) error {
	if err := json.Unmarshal([]byte(s), v); err != nil {
		return fmt.Errorf("%w: %s", err, s)
	}
	return nil
}

// BenchmarkRestartFromReplica measures a whole-job restart after a node
// loss, restored from the stream of the image's chunks from a replica on
// another node (its node's store takes a copy afterwards), and a lazy one
// (the rank runs before its memory has arrived), next to restarts from the
// image on the rank's own node, in the same run: a 1-rank job holding
// CAIRN_BENCH_REPL_MIB (default 512) MiB of random memory, replicas 1, on
// a 4-node cluster. Each row but the fetched restart is the median of
// CAIRN_BENCH_REPS (default 3) samples: a local restart from the image
// kept in staging takes a fresh checkpoint first (a restore uses the kept
// image up); the local restarts from the store follow, with no checkpoint
// in between, so none has a kept image; the lazy restart is repeated as
// often, at least 5 times (a lazy restore keeps no copy, so each is lazy
// again). The
// restart from the stream is one sample: the copy its node stores
// afterwards would make a second one a restart from the store.
func BenchmarkRestartFromReplica(b *testing.B) {
	mib := envInt("CAIRN_BENCH_REPL_MIB", 512)
	reps := envInt("CAIRN_BENCH_REPS", 3)
	keepBudget(b, mib)
	c := testutil.NewCluster(b, 4)
	c.OK("run", "--job", "mem", "--ranks", "1", "--nodes", c.Nodes[0], "--on-failure", "stop", "--", c.Bin, "stateapp", "-no-stream", "-mem", strconv.Itoa(mib), "-dirty-every", "0", "-dir", "/var/lib/stateapp")
	time.Sleep(time.Duration(mib/64+2) * time.Second) // the memory is written
	timed := func(args ...string) time.Duration {
		c.OK("kill", "mem")
		start := time.Now()
		c.OK(append([]string{"restart", "mem"}, args...)...)
		return time.Since(start)
	}
	var kept, stored []time.Duration
	var copies []string
	for range reps {
		c.OK("checkpoint", "mem")
		ck := c.WaitProtected("mem", 10*time.Minute) // no replication during the restart
		copies = ck.Ranks[0].Copies
		kept = append(kept, keptRestart(b, c, copies[0], ck.Seq, timed))
	}
	for range reps {
		if seq := keptSeq(b, c, copies[0]); seq != 0 {
			b.Fatalf("%s keeps the image of checkpoint %d: a restart there would not read the store", copies[0], seq)
		}
		stored = append(stored, timed("--placement", copies[0]))
	}
	// The image's first node dies with its disk; the job restarts on a
	// node without a copy, fetching from the replica, then lazily on the
	// last node, which has no copy either.
	targets := noCopy(b, c, "mem")
	c.OK("node", "fail", copies[0], "--lose-data")
	c.WaitNodes(3, time.Minute)
	remote := timed("--placement", targets[0])
	// The copy it stores afterwards, in the background.
	var fetch time.Duration
	testutil.WaitUntil(b, 5*time.Minute, func() (bool, string) {
		log, _ := os.ReadFile(filepath.Join(c.Data, "cluster", "coordinator", "coordinator.log"))
		m := fetchedRE.FindSubmatch(log)
		if m != nil {
			fetch, _ = time.ParseDuration(string(m[1]))
		}
		return m != nil, "the node restored from the stream never stored its copy"
	})
	var lazy, prefetch []time.Duration
	agentLog := filepath.Join(c.Data, "cluster", "nodes", targets[1], "agent.log")
	for i := range max(reps, 5) {
		lazy = append(lazy, timed("--lazy", "--placement", targets[1]))
		testutil.WaitUntil(b, 5*time.Minute, func() (bool, string) {
			log, _ := os.ReadFile(agentLog)
			ms := lazyDoneRE.FindAllSubmatch(log, -1)
			if len(ms) > i {
				d, _ := time.ParseDuration(string(ms[i][2]))
				prefetch = append(prefetch, d)
			}
			return len(ms) > i, "the lazy restore never completed"
		})
	}
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	b.Logf("restart of a %d MiB rank from its own node: image kept in staging %s (median of %d, each from a fresh checkpoint), from its store %s (median of %d)",
		mib, ms(median(kept)), len(kept), ms(median(stored)), len(stored))
	b.Logf("after its node died, on %s from the stream of the replica on %s: %s (one sample; its copy stored %s after) | ratio to the kept image %.2f, to the store %.2f (target <= 1.3)",
		targets[0], copies[1], ms(remote), ms(fetch), remote.Seconds()/median(kept).Seconds(), remote.Seconds()/median(stored).Seconds())
	b.Logf("lazy, on %s from the replica: running again after %s (median of %d) | ratio to the kept image %.2f, to the store %.2f (target <= 1.0); every page there %s after the page server started (median of %d)",
		targets[1], ms(median(lazy)), len(lazy), median(lazy).Seconds()/median(kept).Seconds(), median(lazy).Seconds()/median(stored).Seconds(), ms(median(prefetch)), len(prefetch))
	record(b,
		atMost(fmt.Sprintf("eager restart on a node without a copy ÷ restart from the local image, %d MiB", mib), remote.Seconds()/median(kept).Seconds(), 1.3,
			fmt.Sprintf("%s / %s kept (%s from the store)", ms(remote), ms(median(kept)), ms(median(stored)))),
		atMost(fmt.Sprintf("lazy restart (until the rank runs) ÷ restart from the local image, %d MiB, median of %d", mib, len(lazy)), median(lazy).Seconds()/median(kept).Seconds(), 1.0,
			fmt.Sprintf("%s / %s", ms(median(lazy)), ms(median(kept)))))
}

// keepBudget lets the agents keep an image of a mib MiB rank in staging
// after its checkpoint, unless CAIRN_KEEP_IMAGES says how much they may:
// their default, 1G, holds no image of a rank of 1 GiB or more, and the
// kept-image restarts would read the store.
func keepBudget(b *testing.B, mib int) {
	if os.Getenv("CAIRN_KEEP_IMAGES") == "" && 2*mib > 1024 {
		b.Setenv("CAIRN_KEEP_IMAGES", fmt.Sprintf("%dM", 2*mib))
	}
}

// keptRestart times a restart of job mem (timed) on node, where it runs,
// from checkpoint seq, whose image node keeps in staging, and checks that
// the restart took that image.
func keptRestart(b *testing.B, c *testutil.Cluster, node string, seq int, timed func(...string) time.Duration) time.Duration {
	b.Helper()
	if got := keptSeq(b, c, node); got != seq {
		b.Fatalf("%s keeps in staging the image of checkpoint %d, not of %d (0: none; CAIRN_KEEP_IMAGES too small?)", node, got, seq)
	}
	d := timed("--placement", node)
	if got := keptSeq(b, c, node); got != 0 {
		b.Fatalf("the restart on %s left the kept image of checkpoint %d: it read the store", node, got)
	}
	return d
}

// keptSeq is the checkpoint whose image node keeps in its staging dir for
// rank 0 of job mem, 0 if none: the note a kept image carries
// (internal/container/kept.go), read from the node's staging dir.
func keptSeq(b *testing.B, c *testutil.Cluster, node string) int {
	b.Helper()
	n, ok := c.File().Node(node)
	if !ok {
		b.Fatalf("no node %s", node)
	}
	buf, err := os.ReadFile(filepath.Join(n.Staging, "kept", "mem.0", "kept.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	var note struct {
		Seq int `json:"seq"`
	}
	if err == nil {
		err = json.Unmarshal(buf, &note)
	}
	if err != nil {
		b.Fatal(err)
	}
	return note.Seq
}

// noCopy are the cluster's nodes that hold no copy of any checkpoint of
// job (at least two, or it fails): a node holding an earlier one, of the
// same memory, would fetch next to nothing of the newest.
func noCopy(b *testing.B, c *testutil.Cluster, job string) []string {
	b.Helper()
	held := map[string]bool{}
	for _, ck := range c.Ckpts(job) {
		for _, r := range ck.Ranks {
			for _, n := range r.Copies {
				held[n] = true
			}
		}
	}
	var out []string
	for _, n := range c.Nodes {
		if !held[n] {
			out = append(out, n)
		}
	}
	if len(out) < 2 {
		b.Fatalf("copies of %s's checkpoints on %v: fewer than two nodes hold none", job, slices.Sorted(maps.Keys(held)))
	}
	return out
}

var lazyDoneRE = regexp.MustCompile(`msg="lazy restore: every page is here" ckpt=mem\.0:\d+ pages=(\d+) took=(\S+)`)
