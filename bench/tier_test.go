package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"
	"golang.org/x/sync/errgroup"

	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/tier"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// BenchmarkTier measures the durable tier against a real S3 server
// (SeaweedFS on loopback): flushing a rank image of CAIRN_BENCH_TIER_MIB
// (512 by default) of incompressible pages into an empty repo, next to a
// raw upload of the same bytes with the same client to the same server
// (16 MiB objects, as many at once as a flush puts); a second flush of
// the image with 10% of its pages changed (what it uploads); and a fetch
// of the image into an empty store next to a raw download of the same
// bytes. Each figure is the median of 3 samples, each into a repo of its
// own.
func BenchmarkTier(b *testing.B) {
	mib := 512
	if v := os.Getenv("CAIRN_BENCH_TIER_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("CAIRN_BENCH_TIER_MIB=%q: want a size in MiB", v)
		}
		mib = n
	}
	ctx := context.Background()
	srv := testutil.NewS3Server(b)
	srv.MakeBucket(b, "bench")
	bucket, err := tier.OpenS3(ctx, tier.S3Config{Endpoint: srv.Endpoint, Bucket: "bench", Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, "")})
	if err != nil {
		b.Fatal(err)
	}
	src, err := store.Open(b.TempDir(), store.Options{Compression: store.CompressionFastest})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	pages := make([]byte, mib<<20)
	rand.Read(pages)
	m1 := putPages(b, src, pages)
	for i := 0; i < len(pages)/4096; i += 10 { // 10% of the pages
		rand.Read(pages[i*4096 : (i+1)*4096])
	}
	m2 := putPages(b, src, pages)
	size := int64(mib) << 20

	const samples = 3
	var raw, flush, second, fetch, download []time.Duration
	var firstBytes, secondBytes int64
	for s := range samples {
		// The raw upload: the same number of bytes as the flush's packs,
		// in 16 MiB objects, as many at once as a flush puts.
		t := time.Now()
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(4)
		obj := make([]byte, tier.PackSize)
		rand.Read(obj)
		var keys []string
		for off := int64(0); off < size; off += tier.PackSize {
			key := fmt.Sprintf("raw%d/%d", s, off)
			keys = append(keys, key)
			n := min(int64(tier.PackSize), size-off)
			g.Go(func() error { return bucket.Put(gctx, key, obj[:n]) })
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		raw = append(raw, time.Since(t))

		repo, err := tier.OpenRepo(ctx, bucket, fmt.Sprintf("job%d", s))
		if err != nil {
			b.Fatal(err)
		}
		t = time.Now()
		st, err := repo.Flush(ctx, src, m1)
		if err != nil {
			b.Fatal(err)
		}
		flush = append(flush, time.Since(t))
		firstBytes = st.Bytes
		t = time.Now()
		st2, err := repo.Flush(ctx, src, m2)
		if err != nil {
			b.Fatal(err)
		}
		second = append(second, time.Since(t))
		secondBytes = st2.Bytes

		// The raw download of the raw upload's objects, then the fetch.
		t = time.Now()
		g, gctx = errgroup.WithContext(ctx)
		g.SetLimit(8)
		for _, k := range keys {
			g.Go(func() error { _, err := bucket.Get(gctx, k); return err })
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		download = append(download, time.Since(t))
		dst, err := store.Open(b.TempDir(), store.Options{Compression: store.CompressionFastest})
		if err != nil {
			b.Fatal(err)
		}
		t = time.Now()
		if _, err := repo.Fetch(ctx, dst, m1); err != nil {
			b.Fatal(err)
		}
		fetch = append(fetch, time.Since(t))
		dst.Close()
		for _, k := range keys {
			bucket.Delete(ctx, k)
		}
	}
	r, f, d, fe := median(raw), median(flush), median(download), median(fetch)
	fmt.Printf("\ndurable tier, %d MiB rank image of incompressible pages, SeaweedFS S3 on loopback, median of %d\n", mib, samples)
	fmt.Printf("%-44s %14s %9s\n", "what", "throughput", "ratio")
	fmt.Printf("%-44s %14s\n", "raw upload, same bytes, same client", rate(size, r))
	fmt.Printf("%-44s %14s %8.2fx\n", "flush into an empty repo (vs raw upload)", rate(size, f), r.Seconds()/f.Seconds())
	fmt.Printf("%-44s %14s\n", "raw download of the same bytes", rate(size, d))
	fmt.Printf("%-44s %14s %8.2fx\n", "fetch into an empty store (vs raw download)", rate(size, fe), d.Seconds()/fe.Seconds())
	fmt.Printf("second flush, 10%% of pages changed: %d bytes uploaded of %d (%.1f%%; the first uploaded %d), in %v\n",
		secondBytes, size, 100*float64(secondBytes)/float64(size), firstBytes, median(second).Round(time.Millisecond))
	b.ReportMetric(r.Seconds()/f.Seconds(), "flush/raw")
	b.ReportMetric(d.Seconds()/fe.Seconds(), "fetch/raw")
}

// putPages stores data as one image file of 4 KiB chunks and returns its
// manifest.
func putPages(b *testing.B, s *store.Store, data []byte) store.ID {
	b.Helper()
	ctx := context.Background()
	n := store.Node{Path: "criu/pages-1.img", Kind: store.KindFile, Mode: 0o600, Size: uint64(len(data))}
	for off := 0; off < len(data); off += 4096 {
		id, _, err := s.Put(ctx, data[off:off+4096])
		if err != nil {
			b.Fatal(err)
		}
		n.Chunks = append(n.Chunks, id)
	}
	m := &store.Manifest{Nodes: []store.Node{{Path: "criu", Kind: store.KindDir, Mode: 0o700}, n}}
	id, err := s.PutManifest(ctx, m)
	if err != nil {
		b.Fatal(err)
	}
	return id
}

// BenchmarkRestartFromTier measures a restart from the durable tier next
// to a restart from local images, in one run: a 1-rank job holding
// CAIRN_BENCH_REPL_MIB (512) MiB of random memory, its tier a real S3
// server (SeaweedFS), is checkpointed and flushed. The baseline restarts
// it on its own node from that node's store (the agents keep no image in
// staging: CAIRN_KEEP_IMAGES=0). Then a second cluster, which has never
// seen the job, restarts it from the tier: fetched whole and verified,
// then restored; and with --lazy, its memory read from the tier as it
// runs. Each is timed from cairn restart to the job running again, median
// of CAIRN_BENCH_REPS (3); between two restarts from the tier the job is
// removed (and the node's store reclaimed), so each reads everything
// again. For --lazy, the time the pages took to arrive after the restore
// (the agent's log) is printed too.
func BenchmarkRestartFromTier(b *testing.B) {
	mib := envInt("CAIRN_BENCH_REPL_MIB", 512)
	reps := envInt("CAIRN_BENCH_REPS", 3)
	b.Setenv("CAIRN_KEEP_IMAGES", "0")
	a := testutil.NewCluster(b, 1)
	srv := testutil.NewS3ServerOn(b, a.Gateway())
	srv.MakeBucket(b, "ckpts")
	a.RestartAgent(a.Nodes[0], srv.Env()...)
	url := "s3://ckpts/bench"
	a.OK("run", "--job", "mem", "--ranks", "1", "--tier", url, "--on-failure", "stop", "--", a.Bin, "stateapp", "-no-stream", "-mem", strconv.Itoa(mib), "-dirty-every", "0", "-dir", "/var/lib/stateapp")
	time.Sleep(time.Duration(mib/64+2) * time.Second) // the memory is written
	a.OK("checkpoint", "mem")                         // durable: a 1-node cluster has no replica to wait for
	t := time.Now()
	a.OK("flush", "mem")
	flushed := time.Since(t)
	timed := func(c *testutil.Cluster, args ...string) time.Duration {
		start := time.Now()
		c.OK(append([]string{"restart", "mem"}, args...)...)
		return time.Since(start)
	}
	var local []time.Duration
	for range reps {
		a.OK("kill", "mem")
		local = append(local, timed(a))
	}
	a.OK("kill", "mem")

	c := testutil.NewCluster(b, 1)
	srv.Rebind(c.Gateway())
	c.RestartAgent(c.Nodes[0], srv.Env()...)
	count := func(msg string) int { return strings.Count(c.AgentLog(c.Nodes[0]), `msg="`+msg+`"`) }
	// A restart that fetched leaves the image in the node's store: the job
	// is removed and the store reclaimed before the next. A lazy one
	// leaves nothing there: it is removed once every page has arrived,
	// and how long that took after the restart is kept.
	fromTier := func(args ...string) (restarts, allHere []time.Duration) {
		lazy := slices.Contains(args, "--lazy")
		for range reps {
			done := count("lazy restore: every page is here")
			restarts = append(restarts, timed(c, append([]string{"--from", url}, args...)...))
			if lazy {
				testutil.WaitUntil(b, 5*time.Minute, func() (bool, string) {
					return count("lazy restore: every page is here") > done, "the lazy restore never completed"
				})
				took := regexp.MustCompile(`msg="lazy restore: every page is here" ckpt=mem\.0:\d+ pages=\d+ took=(\S+)`).FindAllStringSubmatch(c.AgentLog(c.Nodes[0]), -1)
				d, err := time.ParseDuration(took[len(took)-1][1])
				if err != nil {
					b.Fatal(err)
				}
				allHere = append(allHere, d)
			}
			before := count("store reclaimed")
			c.OK("rm", "-f", "mem")
			if !lazy {
				testutil.WaitUntil(b, 5*time.Minute, func() (bool, string) {
					return count("store reclaimed") > before, "the node's store was not reclaimed after the job's removal"
				})
			}
		}
		return restarts, allHere
	}
	full, _ := fromTier()
	lazy, allHere := fromTier("--lazy")
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	l := median(local)
	fmt.Printf("\nrestart of a %d MiB rank, median of %d; its flush to the tier (SeaweedFS, the node's gateway) took %s\n", mib, reps, ms(flushed))
	fmt.Printf("%-58s %10s %7s\n", "what", "time", "ratio")
	fmt.Printf("%-58s %10s\n", "from its own node's store", ms(l))
	fmt.Printf("%-58s %10s %6.2fx\n", "from the tier, on a cluster that never saw it", ms(median(full)), median(full).Seconds()/l.Seconds())
	fmt.Printf("%-58s %10s %6.2fx (target <= 1.5)\n", "from the tier, --lazy", ms(median(lazy)), median(lazy).Seconds()/l.Seconds())
	fmt.Printf("%-58s %10s\n", "  then every page read from the tier, after the restore", ms(median(allHere)))
	b.ReportMetric(median(full).Seconds()/l.Seconds(), "tier/local")
	b.ReportMetric(median(lazy).Seconds()/l.Seconds(), "lazy-tier/local")
}
