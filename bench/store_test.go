package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/chunker"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/store"
)

// fillData writes n bytes to w: random (incompressible) or text-like
// (compresses about 3-4x with zstd -1).
func fillData(w io.Writer, n int64, compressible bool, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, 7))
	buf := make([]byte, 1<<20)
	words := []string{"checkpoint ", "rank ", "node ", "restore ", "0x7f3a ", "replica ", "\n", "chunk ", "42 ", "memory "}
	for n > 0 {
		if compressible {
			buf = buf[:0]
			for len(buf) < 1<<20-16 {
				buf = append(buf, words[r.IntN(len(words))]...)
				if r.IntN(8) == 0 {
					buf = fmt.Appendf(buf, "%d ", r.Uint32())
				}
			}
		} else {
			buf = buf[:1<<20]
			for i := 0; i+8 <= len(buf); i += 8 {
				v := r.Uint64()
				for j := 0; j < 8; j++ {
					buf[i+j] = byte(v >> (8 * j))
				}
			}
		}
		k := min(int64(len(buf)), n)
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// stageImage makes a staged image with one CRIU pages file of n bytes.
func stageImage(b *testing.B, dir string, n int64, compressible bool, seed uint64) {
	b.Helper()
	os.MkdirAll(filepath.Join(dir, image.CRIUDir), 0o700)
	f, err := os.Create(filepath.Join(dir, image.CRIUDir, "pages-1.img"))
	if err != nil {
		b.Fatal(err)
	}
	if err := fillData(f, n, compressible, seed); err != nil {
		b.Fatal(err)
	}
	f.Close()
	// An empty fs delta (a tar end marker).
	if err := os.WriteFile(filepath.Join(dir, image.DeltaName), make([]byte, 1024), 0o600); err != nil {
		b.Fatal(err)
	}
}

func rate(n int64, d time.Duration) string {
	return fmt.Sprintf("%7.1f MB/s", float64(n)/d.Seconds()/1e6)
}

// diskWrite writes n bytes to a new file on the data disk and fsyncs it.
func diskWrite(b *testing.B, dir string, n int64) time.Duration {
	b.Helper()
	p := filepath.Join(dir, "disk-baseline")
	defer os.Remove(p)
	buf := make([]byte, 4<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	t := time.Now()
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	for w := int64(0); w < n; w += int64(len(buf)) {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	f.Sync()
	f.Close()
	return time.Since(t)
}

// hashCompressLimit is how fast both cores can chunk, hash and compress
// the file, with nothing written: the CPU bound of an ingest.
func hashCompressLimit(b *testing.B, path string, p chunker.Params) time.Duration {
	b.Helper()
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(runtime.NumCPU()))
	jobs := make(chan []byte, 64)
	var wg sync.WaitGroup
	t := time.Now()
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []byte
			for c := range jobs {
				blake3.Sum256(c)
				dst = enc.EncodeAll(c, dst[:0])
			}
		}()
	}
	c := chunker.New(f, p)
	for {
		ch, err := c.Next(make([]byte, p.Max))
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		jobs <- ch.Data
	}
	close(jobs)
	wg.Wait()
	return time.Since(t)
}

// BenchmarkIngest measures ingesting a staged image into a fresh store, for
// incompressible and compressible data, next to the disk's sequential
// write speed, the CPU limit of chunking+hashing+compressing, and
// `tar | zstd -1 -T0` of the same directory, all in the same run; and
// materializing it next to a plain copy of the same bytes.
func BenchmarkIngest(b *testing.B) {
	size := int64(envInt("CAIRN_BENCH_INGEST_MIB", 512)) << 20
	ctx := context.Background()
	base := b.TempDir()
	fmt.Printf("\n%-15s %-34s %14s %9s\n", "data", "what", "throughput", "ratio")
	for _, compressible := range []bool{false, true} {
		kind := "incompressible"
		if compressible {
			kind = "compressible"
		}
		b.Run(kind, func(b *testing.B) {
			src := filepath.Join(base, kind)
			stageImage(b, src, size, compressible, 1)
			exec.Command("sync").Run()
			pages := filepath.Join(src, image.CRIUDir, "pages-1.img")

			disk := diskWrite(b, base, size)
			limit := hashCompressLimit(b, pages, chunker.PageParams)
			tz := filepath.Join(base, "tar.zst")
			t := time.Now()
			if out, err := exec.Command("sh", "-c", fmt.Sprintf("tar -C %s -cf - . | zstd -q -1 -T0 -o %s && sync -f %s", src, tz, tz)).CombinedOutput(); err != nil {
				b.Fatalf("tar | zstd: %v %s", err, out)
			}
			tarZstd := time.Since(t)
			os.Remove(tz)

			repo := image.Repo{Dir: filepath.Join(base, "cat-"+kind), StoreDir: filepath.Join(base, "store-"+kind), Compression: store.CompressionFastest}
			rec := &image.Record{Container: "b", Seq: 1}
			t = time.Now()
			if err := repo.Ingest(ctx, src, rec, nil); err != nil {
				b.Fatal(err)
			}
			ingest := time.Since(t)
			bound := max(disk, limit)
			fmt.Printf("%-15s %-34s %14s\n", kind, "disk sequential write + fsync", rate(size, disk))
			fmt.Printf("%-15s %-34s %14s\n", kind, "chunk+hash+compress, 2 cores", rate(size, limit))
			fmt.Printf("%-15s %-34s %14s\n", kind, "tar | zstd -1 -T0 (+sync)", rate(size, tarZstd))
			fmt.Printf("%-15s %-34s %14s %8.2fx\n", kind, "cairn ingest vs slower bound", rate(size, ingest), bound.Seconds()/ingest.Seconds())
			fmt.Printf("%-15s %-34s %14s %8.2fx\n", kind, "cairn ingest vs tar|zstd", "", tarZstd.Seconds()/ingest.Seconds())
			b.ReportMetric(bound.Seconds()/ingest.Seconds(), "ingest/bound")

			// Materialize (what a restore reads) next to a plain copy.
			dst := filepath.Join("/dev/shm", fmt.Sprintf("cairn-bench-mat-%d", os.Getpid()))
			defer os.RemoveAll(dst)
			os.MkdirAll(filepath.Join(dst, "criu"), 0o700)
			os.MkdirAll(filepath.Join(dst, "fs"), 0o700)
			t = time.Now()
			if err := repo.Materialize(ctx, rec, filepath.Join(dst, "criu"), filepath.Join(dst, "fs"), nil); err != nil {
				b.Fatal(err)
			}
			mat := time.Since(t)
			os.RemoveAll(dst)
			os.MkdirAll(dst, 0o700)
			t = time.Now()
			if out, err := exec.Command("cp", pages, dst).CombinedOutput(); err != nil {
				b.Fatalf("cp: %v %s", err, out)
			}
			cp := time.Since(t)
			fmt.Printf("%-15s %-34s %14s\n", kind, "plain cp to tmpfs", rate(size, cp))
			fmt.Printf("%-15s %-34s %14s %8.2fx\n", kind, "cairn materialize (verified)", rate(size, mat), cp.Seconds()/mat.Seconds())
			b.ReportMetric(cp.Seconds()/mat.Seconds(), "materialize/cp")
			os.RemoveAll(src)
		})
	}
}

// BenchmarkSuccessive ingests 4 successive images of a 256 MiB memory
// image, 10% of whose pages change each time, next to writing each as a
// plain copy: time and bytes per checkpoint.
func BenchmarkSuccessive(b *testing.B) {
	const size = 256 << 20
	const page = 4096
	ctx := context.Background()
	base := b.TempDir()
	mem := make([]byte, size)
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i+8 <= len(mem); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			mem[i+j] = byte(v >> (8 * j))
		}
	}
	repo := image.Repo{Dir: filepath.Join(base, "cat"), StoreDir: filepath.Join(base, "store"), Compression: store.CompressionFastest}
	fmt.Printf("\n%-4s %12s %14s %12s %14s\n", "ckpt", "cairn time", "cairn bytes", "copy time", "copy bytes")
	for i := 1; i <= 4; i++ {
		if i > 1 {
			for _, p := range r.Perm(size / page)[:size/page/10] {
				for j := p * page; j < (p+1)*page; j += 8 {
					v := r.Uint64()
					for k := 0; k < 8; k++ {
						mem[j+k] = byte(v >> (8 * k))
					}
				}
			}
		}
		src := filepath.Join(base, fmt.Sprintf("src%d", i))
		os.MkdirAll(filepath.Join(src, image.CRIUDir), 0o700)
		os.WriteFile(filepath.Join(src, image.CRIUDir, "pages-1.img"), mem, 0o600)
		os.WriteFile(filepath.Join(src, image.DeltaName), make([]byte, 1024), 0o600)
		rec := &image.Record{Container: "s", Seq: i}
		t := time.Now()
		if err := repo.Ingest(ctx, src, rec, nil); err != nil {
			b.Fatal(err)
		}
		ct := time.Since(t)
		t = time.Now()
		cpDst := filepath.Join(base, fmt.Sprintf("copy%d", i))
		f, _ := os.Create(cpDst)
		f.Write(mem)
		f.Sync()
		f.Close()
		cpt := time.Since(t)
		fmt.Printf("%-4d %12s %14d %12s %14d\n", i, ct.Round(time.Millisecond), rec.NewBytes, cpt.Round(time.Millisecond), size)
		os.RemoveAll(src)
	}
}
