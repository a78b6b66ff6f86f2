package chunker_test

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/chunker"
)

// This file compares how well content-defined and fixed-size chunking
// deduplicate two versions of a synthetic memory image. The numbers in
// docs/format.md come from
//
//	CAIRN_DEDUP_MIB=256 go test -run '^$' -bench Dedup -benchtime 1x ./internal/chunker

// scenario turns version 1 of an image into version 2.
type scenario struct {
	name string
	edit func(v1 []byte, rng *rand.Rand) []byte
}

var scenarios = []scenario{
	{"pages-10%-scattered", func(v1 []byte, rng *rand.Rand) []byte {
		return changePages(v1, rng, 1)
	}},
	{"pages-10%-runs-of-16", func(v1 []byte, rng *rand.Rand) []byte {
		return changePages(v1, rng, 16)
	}},
	{"bytes-inserted", func(v1 []byte, rng *rand.Rand) []byte {
		// One byte inserted per 32 MiB, at least one.
		n := max(1, len(v1)/(32<<20))
		return insertAt(v1, rng, n, 1)
	}},
	{"page-inserted", func(v1 []byte, rng *rand.Rand) []byte {
		return insertAt(v1, rng, 1, chunker.PageSize)
	}},
}

var dedupParams = []struct {
	name string
	p    chunker.Params
}{
	{"cdc-64K-256K-1M", chunker.DefaultParams},
	{"cdc-16K-64K-256K", chunker.Params{Min: 16 << 10, Avg: 64 << 10, Max: 256 << 10}},
	{"cdc-2K-8K-32K", smallParams},
	{"fixed-4K", chunker.Fixed(4 << 10)},
	{"fixed-64K", chunker.Fixed(64 << 10)},
	{"fixed-256K", chunker.Fixed(256 << 10)},
}

// memoryImage returns n pages of random content: the worst case for
// compression and the neutral case for chunking.
func memoryImage(n int) []byte { return randData(100, n*chunker.PageSize) }

// changePages rewrites 10% of the pages of v1, in runs of run pages.
func changePages(v1 []byte, rng *rand.Rand, run int) []byte {
	v2 := bytes.Clone(v1)
	pages := len(v1) / chunker.PageSize
	runs := pages / 10 / run
	for _, r := range rng.Perm(pages / run)[:runs] {
		off := r * run * chunker.PageSize
		fill(rng, v2[off:off+run*chunker.PageSize])
	}
	return v2
}

// insertAt inserts n runs of size random bytes into v1: one near the start
// of each n-th of the image, so that most of the image lies behind an
// insertion (the case that matters for fixed-size chunks).
func insertAt(v1 []byte, rng *rand.Rand, n, size int) []byte {
	seg := len(v1) / n
	var v2 []byte
	for i := range n {
		at := i*seg + rng.IntN(seg/8)
		if size == chunker.PageSize {
			at -= at % chunker.PageSize
		}
		end := (i + 1) * seg
		if i == n-1 {
			end = len(v1)
		}
		ins := make([]byte, size)
		fill(rng, ins)
		v2 = append(append(append(v2, v1[i*seg:at]...), ins...), v1[at:end]...)
	}
	return v2
}

func fill(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

type dedupResult struct {
	reused float64 // fraction of v2's bytes in chunks that v1 already has
	chunks int     // chunks in v2
}

func measureDedup(tb testing.TB, v1, v2 []byte, p chunker.Params) dedupResult {
	tb.Helper()
	known := make(map[[32]byte]bool)
	buf := make([]byte, p.Max)
	each := func(data []byte, fn func(chunker.Chunk, [32]byte)) {
		c := chunker.New(bytes.NewReader(data), p)
		for {
			ch, err := c.Next(buf)
			if err == io.EOF {
				return
			}
			if err != nil {
				tb.Fatal(err)
			}
			fn(ch, blake3.Sum256(ch.Data))
		}
	}
	each(v1, func(_ chunker.Chunk, id [32]byte) { known[id] = true })
	var r dedupResult
	var reused int
	each(v2, func(ch chunker.Chunk, id [32]byte) {
		r.chunks++
		if known[id] {
			reused += ch.Length
		}
	})
	r.reused = float64(reused) / float64(len(v2))
	return r
}

// TestDedupComparison pins the qualitative findings recorded in
// docs/format.md on a small image.
func TestDedupComparison(t *testing.T) {
	v1 := memoryImage(2048) // 8 MiB
	tests := []struct {
		scenario string
		params   string
		min, max float64
	}{
		// Scattered page writes: only page-sized chunks survive.
		{"pages-10%-scattered", "fixed-4K", 0.89, 0.91},
		{"pages-10%-scattered", "cdc-64K-256K-1M", 0, 0.05},
		// Clustered writes leave room for bigger chunks.
		{"pages-10%-runs-of-16", "fixed-4K", 0.89, 0.91},
		{"pages-10%-runs-of-16", "fixed-64K", 0.89, 0.91},
		{"pages-10%-runs-of-16", "cdc-16K-64K-256K", 0.5, 0.9},
		// Unaligned insertions defeat fixed-size chunks.
		{"bytes-inserted", "cdc-64K-256K-1M", 0.8, 1},
		{"bytes-inserted", "fixed-4K", 0, 0.2},
		// A page inserted keeps 4 KiB chunks aligned, but not larger ones.
		{"page-inserted", "fixed-4K", 0.99, 1},
		{"page-inserted", "fixed-64K", 0, 0.2},
		{"page-inserted", "cdc-64K-256K-1M", 0.8, 1},
	}
	params := make(map[string]chunker.Params)
	for _, dp := range dedupParams {
		params[dp.name] = dp.p
	}
	edited := make(map[string][]byte)
	for _, sc := range scenarios {
		edited[sc.name] = sc.edit(v1, rand.New(rand.NewPCG(1, 2)))
	}
	for _, tc := range tests {
		t.Run(tc.scenario+"/"+tc.params, func(t *testing.T) {
			r := measureDedup(t, v1, edited[tc.scenario], params[tc.params])
			if r.reused < tc.min || r.reused > tc.max {
				t.Errorf("reused %.3f of the bytes, want %.2f..%.2f", r.reused, tc.min, tc.max)
			}
		})
	}
}

// BenchmarkDedup reports, for every scenario and chunker, the percentage of
// version 2's bytes found in chunks of version 1 ("reused-%") and the chunk
// count per GiB of image ("chunks/GiB"). Only the metrics matter; run it with
// -benchtime 1x.
func BenchmarkDedup(b *testing.B) {
	mib := 64
	if s := os.Getenv("CAIRN_DEDUP_MIB"); s != "" {
		var err error
		if mib, err = strconv.Atoi(s); err != nil {
			b.Fatalf("CAIRN_DEDUP_MIB: %v", err)
		}
	}
	v1 := memoryImage(mib << 20 / chunker.PageSize)
	for _, sc := range scenarios {
		v2 := sc.edit(v1, rand.New(rand.NewPCG(1, 2)))
		for _, dp := range dedupParams {
			b.Run(fmt.Sprintf("%s/%s", sc.name, dp.name), func(b *testing.B) {
				var r dedupResult
				for b.Loop() {
					r = measureDedup(b, v1, v2, dp.p)
				}
				b.ReportMetric(100*r.reused, "reused-%")
				b.ReportMetric(float64(r.chunks)*float64(1<<30)/float64(len(v2)), "chunks/GiB")
			})
		}
	}
}

// BenchmarkChunker measures chunking throughput without hashing.
func BenchmarkChunker(b *testing.B) {
	data := randData(200, 32<<20)
	for _, dp := range dedupParams {
		b.Run(dp.name, func(b *testing.B) {
			buf := make([]byte, dp.p.Max)
			c := chunker.New(nil, dp.p)
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				c.Reset(bytes.NewReader(data))
				for {
					if _, err := c.Next(buf); err == io.EOF {
						break
					} else if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
