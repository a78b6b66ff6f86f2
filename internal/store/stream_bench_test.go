package store_test

import (
	"context"
	"io"
	"sync"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
)

// BenchmarkChunkStream moves 64 MiB of random 4 KiB chunks from one store
// to another as chunk streams of 1,024 chunks, two at once, as a fetch
// does: the store's own cost of the path replication and restart take.
func BenchmarkChunkStream(b *testing.B) {
	ctx := context.Background()
	const n = 16384
	src, err := store.Open(b.TempDir(), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	ids := make([]store.ID, n)
	for i := range ids {
		ids[i] = mustPut(b, src, randBytes(uint64(i), 4096))
	}
	if err := src.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(n * 4096)
	for b.Loop() {
		b.StopTimer()
		dst, err := store.Open(b.TempDir(), store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		var mu sync.Mutex
		next := 0
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				for {
					mu.Lock()
					lo := next
					next += 1024
					mu.Unlock()
					if lo >= n {
						return
					}
					share := ids[lo:min(lo+1024, n)]
					pr, pw := io.Pipe()
					go func() { pw.CloseWithError(src.ExportChunks(ctx, pw, share, store.ChunkStreamV2)) }()
					if _, err := dst.ImportChunks(ctx, pr, share); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if err := dst.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		dst.Close()
		b.StartTimer()
	}
}
