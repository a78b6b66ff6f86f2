package store_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

func TestPutGet(t *testing.T) {
	s := store.TestStore(t)
	ctx := context.Background()
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", []byte{}},
		{"one byte", []byte{7}},
		{"random", randBytes(1, 300<<10)},
		{"compressible", compressible(2, 256<<10)},
		{"zeros", make([]byte, 1<<20)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, stored, err := s.Put(ctx, tc.data)
			if err != nil || !stored {
				t.Fatalf("Put = %v, %v; want stored", stored, err)
			}
			if id != store.Hash(tc.data) {
				t.Fatalf("Put returned id %s, want the hash %s", id, store.Hash(tc.data))
			}
			if !s.Has(id) {
				t.Fatal("Has = false after Put")
			}
			mustGet(t, s, id, tc.data)
			id2, stored, err := s.Put(ctx, bytes.Clone(tc.data))
			if err != nil || stored || id2 != id {
				t.Fatalf("second Put = %s, %v, %v; want %s, not stored", id2, stored, err, id)
			}
		})
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		mustGet(t, s, store.Hash(tc.data), tc.data)
		if _, stored, _ := s.Put(ctx, tc.data); stored {
			t.Errorf("%s: Put after Flush stored a known chunk again", tc.name)
		}
	}
}

func TestGetNotFound(t *testing.T) {
	s := store.TestStore(t)
	id := store.Hash([]byte("never put"))
	if s.Has(id) {
		t.Fatal("Has = true for an unknown chunk")
	}
	if _, err := s.Get(context.Background(), id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get = %v, want ErrNotFound", err)
	}
}

func TestReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(dir, store.TestOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	var ids []store.ID
	var data [][]byte
	for i := range 20 {
		d := randBytes(uint64(i), 100<<10+i)
		ids = append(ids, mustPut(t, s, d))
		data = append(data, d)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, dir)
	for i, id := range ids {
		mustGet(t, s, id, data[i])
	}
	if got := files(t, dir, "tmp"); len(got) != 0 {
		t.Errorf("tmp/ holds %v after a clean close", got)
	}
}

// TestPacks checks pack rollover, compression flags and reading chunks that
// are still in the open pack.
func TestPacks(t *testing.T) {
	dir := t.TempDir()
	opts := store.TestOptions(t)
	opts.PackSize = 512 << 10
	s, err := store.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	random := make(map[store.ID][]byte)
	for i := range 10 {
		d := randBytes(uint64(100+i), 200<<10)
		random[mustPut(t, s, d)] = d
		// Readable before any flush, from the open pack or a finished one.
		mustGet(t, s, store.Hash(d), d)
	}
	squeezable := compressible(3, 200<<10)
	mustPut(t, s, squeezable)
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	packs := files(t, dir, "packs")
	if len(packs) < 4 {
		t.Fatalf("got %d packs for 2 MiB with 512 KiB packs", len(packs))
	}
	var entries int
	for _, p := range packs {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if store.Hash(b).String() != filepath.Base(p) {
			t.Errorf("pack %s is not named by its hash", p)
		}
		es, err := pack.ReadHeader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatalf("pack %s: %v", p, err)
		}
		for _, e := range es {
			entries++
			_, isRandom := random[e.ID]
			switch {
			case isRandom && e.Compression != pack.None:
				t.Errorf("random chunk stored with %v", e.Compression)
			case e.ID == store.Hash(squeezable) && (e.Compression != pack.Zstd || e.Length >= e.RawLength/10):
				t.Errorf("compressible chunk stored as %v in %d of %d bytes", e.Compression, e.Length, e.RawLength)
			}
		}
	}
	if entries != 11 {
		t.Errorf("packs hold %d chunks, want 11", entries)
	}
	if idx := files(t, dir, "index"); len(idx) != 1 {
		t.Errorf("index files %v, want one per flush", idx)
	}
}

func TestCorruption(t *testing.T) {
	tests := []struct {
		name   string
		data   []byte
		damage func(t *testing.T, path string, e pack.Entry)
	}{
		{"flipped raw byte", randBytes(1, 10000), func(t *testing.T, path string, e pack.Entry) {
			flipByte(t, path, int64(e.Offset)+5000)
		}},
		{"flipped zstd byte", compressible(2, 100000), func(t *testing.T, path string, e pack.Entry) {
			flipByte(t, path, int64(e.Offset)+int64(e.Length)/2)
		}},
		{"truncated pack", randBytes(3, 10000), func(t *testing.T, path string, e pack.Entry) {
			if err := os.Truncate(path, int64(e.Offset)+100); err != nil {
				t.Fatal(err)
			}
		}},
		{"missing pack", randBytes(4, 10000), func(t *testing.T, path string, e pack.Entry) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := store.TestStore(t)
			id := mustPut(t, s, tc.data)
			if err := s.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			packs := files(t, s.Dir(), "packs")
			path := filepath.Join(s.Dir(), packs[0])
			b, _ := os.ReadFile(path)
			es, err := pack.ReadHeader(bytes.NewReader(b), int64(len(b)))
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, path, es[0])

			_, err = s.Get(context.Background(), id)
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("Get = %v, want ErrCorrupt", err)
			}
			var ce *store.CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("Get error %T is not a *CorruptError", err)
			}
			if ce.ID != id || ce.Pack.String() != filepath.Base(path) || ce.Offset != es[0].Offset {
				t.Errorf("CorruptError{ID: %s, Pack: %s, Offset: %d}, want %s, %s, %d",
					ce.ID, ce.Pack, ce.Offset, id, filepath.Base(path), es[0].Offset)
			}
		})
	}
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0x20
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLocking(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(dir, store.TestOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	data := randBytes(1, 1000)
	id := mustPut(t, s, data)
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(dir, store.TestOptions(t)); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("second writer Open = %v, want ErrLocked", err)
	}

	// A reader opens while the writer holds the lock.
	ropts := store.TestOptions(t)
	ropts.ReadOnly = true
	r, err := store.Open(dir, ropts)
	if err != nil {
		t.Fatalf("reader Open: %v", err)
	}
	mustGet(t, r, id, data)
	if _, _, err := r.Put(context.Background(), []byte("x")); !errors.Is(err, store.ErrReadOnly) {
		t.Errorf("reader Put = %v, want ErrReadOnly", err)
	}
	if err := r.Flush(context.Background()); !errors.Is(err, store.ErrReadOnly) {
		t.Errorf("reader Flush = %v, want ErrReadOnly", err)
	}
	if _, err := r.PutManifest(context.Background(), &store.Manifest{}); !errors.Is(err, store.ErrReadOnly) {
		t.Errorf("reader PutManifest = %v, want ErrReadOnly", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := reopen(t, dir)
	mustGet(t, s2, id, data)

	if _, err := store.Open(filepath.Join(dir, "missing"), ropts); err == nil {
		t.Error("reader Open of a missing store succeeded")
	}
}

func TestClosed(t *testing.T) {
	s, err := store.Open(t.TempDir(), store.TestOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	id := mustPut(t, s, []byte("data"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	ctx := context.Background()
	if _, _, err := s.Put(ctx, []byte("more")); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Put = %v, want ErrClosed", err)
	}
	if _, err := s.Get(ctx, id); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Get = %v, want ErrClosed", err)
	}
	if err := s.Flush(ctx); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Flush = %v, want ErrClosed", err)
	}
}

func TestCanceledContext(t *testing.T) {
	s := store.TestStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := s.Put(ctx, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Errorf("Put = %v", err)
	}
	if _, err := s.Get(ctx, store.ID{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Get = %v", err)
	}
	if err := s.Flush(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Flush = %v", err)
	}
}

func TestConcurrentPut(t *testing.T) {
	s := store.TestStore(t)
	ctx := context.Background()
	const workers, chunks = 4, 40
	var wg sync.WaitGroup
	var mu sync.Mutex
	storedCount := make(map[store.ID]int)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range chunks {
				// Every worker puts the same chunks, in different orders.
				d := randBytes(uint64((i+w*7)%chunks), 20<<10)
				id, stored, err := s.Put(ctx, d)
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := s.Get(ctx, id); err != nil {
					t.Error(err)
				}
				mu.Lock()
				if stored {
					storedCount[id]++
				}
				mu.Unlock()
				if i%10 == 0 {
					if err := s.Flush(ctx); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if len(storedCount) != chunks {
		t.Errorf("%d chunks stored, want %d", len(storedCount), chunks)
	}
	for id, n := range storedCount {
		if n != 1 {
			t.Errorf("chunk %s stored %d times", id.Short(), n)
		}
	}
}
