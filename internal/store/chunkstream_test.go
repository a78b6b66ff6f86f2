package store_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
)

// chunkFixture puts n random 4 KiB chunks into a new store and returns
// the store and their ids.
func chunkFixture(t testing.TB, n int) (*store.Store, []store.ID) {
	t.Helper()
	ctx := context.Background()
	s := store.TestStore(t)
	ids := make([]store.ID, n)
	for i := range ids {
		b := make([]byte, 4096)
		rand.Read(b)
		id, _, err := s.Put(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return s, ids
}

func chunkStream(t testing.TB, s *store.Store, ids []store.ID) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := s.ExportChunks(context.Background(), &buf, ids); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestChunkStream(t *testing.T) {
	ctx := context.Background()
	src, ids := chunkFixture(t, 64)
	stream := chunkStream(t, src, ids[10:40])

	dst := store.TestStore(t)
	n, err := dst.ImportChunks(ctx, bytes.NewReader(stream), ids[10:40])
	if err != nil || n != 30 {
		t.Fatalf("import: %d chunks, %v", n, err)
	}
	for i, id := range ids {
		if has := dst.Has(id); has != (i >= 10 && i < 40) {
			t.Fatalf("chunk %d: has %v", i, has)
		}
	}
	for _, id := range ids[10:40] {
		a, _ := src.Get(ctx, id)
		b, err := dst.Get(ctx, id)
		if err != nil || !bytes.Equal(a, b) {
			t.Fatalf("chunk %s differs after import: %v", id.Short(), err)
		}
	}

	t.Run("others refused", func(t *testing.T) {
		for name, want := range map[string][]store.ID{
			"other order": append([]store.ID{ids[11], ids[10]}, ids[12:40]...),
			"fewer":       ids[10:39],
			"more":        ids[10:41],
		} {
			_, err := store.TestStore(t).ImportChunks(ctx, bytes.NewReader(stream), want)
			if !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("%s: %v, want ErrCorrupt", name, err)
			}
		}
	})
	t.Run("cut", func(t *testing.T) {
		// A stream cut short keeps the chunks before the cut, and says
		// truncated, not damaged.
		d := store.TestStore(t)
		n, err := d.ImportChunks(ctx, bytes.NewReader(stream[:len(stream)/2]), ids[10:40])
		if !errors.Is(err, store.ErrCorrupt) || !errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, store.ErrSenderDamaged) {
			t.Fatalf("cut stream: %v", err)
		}
		if n == 0 || n >= 30 || !d.Has(ids[10+n-1]) || d.Has(ids[10+n]) {
			t.Fatalf("cut stream: %d chunks read", n)
		}
	})
	t.Run("flipped", func(t *testing.T) {
		b := bytes.Clone(stream)
		b[len(b)/2] ^= 1
		_, err := store.TestStore(t).ImportChunks(ctx, bytes.NewReader(b), ids[10:40])
		if !errors.Is(err, store.ErrCorrupt) || errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("flipped byte: %v", err)
		}
	})
	t.Run("not here", func(t *testing.T) {
		if err := src.ExportChunks(ctx, io.Discard, []store.ID{ids[0], store.Hash([]byte("x"))}); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("export of a chunk the store lacks: %v", err)
		}
	})
}

// TestChunkStreamSenderDamaged: a sender whose copy of a chunk is damaged
// says so in the stream; the receiver keeps what came before and tells
// that damage from a cut.
func TestChunkStreamSenderDamaged(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src, err := store.Open(dir, store.TestOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	var ids []store.ID
	for range 8 {
		b := make([]byte, 4096)
		rand.Read(b)
		id, _, err := src.Put(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	// Flip a byte of the last chunk in its pack (chunks are appended in
	// order, uncompressible, so it is near the end).
	packs, _ := filepath.Glob(filepath.Join(dir, "packs", "*", "*"))
	if len(packs) != 1 {
		t.Fatalf("packs: %v", packs)
	}
	b, _ := os.ReadFile(packs[0])
	b[len(b)-2048-256] ^= 1
	os.WriteFile(packs[0], b, 0o600)
	src, err = store.Open(dir, store.TestOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var buf bytes.Buffer
	if err := src.ExportChunks(ctx, &buf, ids); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("export of a damaged chunk: %v", err)
	}
	dst := store.TestStore(t)
	n, err := dst.ImportChunks(ctx, &buf, ids)
	if !errors.Is(err, store.ErrSenderDamaged) || !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("import: %v, want the sender's damage", err)
	}
	if n != 7 || !dst.Has(ids[6]) || dst.Has(ids[7]) {
		t.Fatalf("import kept %d chunks, want the 7 before the damaged one", n)
	}
}

// FuzzImportChunks: a chunk stream is hostile input; whatever it holds,
// ImportChunks stores only chunks that verify against what was asked.
func FuzzImportChunks(f *testing.F) {
	src, ids := chunkFixture(f, 4)
	stream := chunkStream(f, src, ids)
	f.Add(stream, uint8(4))
	f.Add(stream[:len(stream)/2], uint8(4))
	f.Add([]byte(store.ChunkStreamMagic), uint8(0))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte, k uint8) {
		want := ids[:int(k)%(len(ids)+1)]
		dst := store.TestStore(t)
		n, err := dst.ImportChunks(ctx, bytes.NewReader(data), want)
		if err == nil && n != len(want) {
			t.Fatalf("import ok with %d of %d chunks", n, len(want))
		}
		if n > len(want) {
			t.Fatalf("%d chunks read, %d asked", n, len(want))
		}
		for i, id := range want {
			if dst.Has(id) != (i < n) {
				t.Fatalf("chunk %d: has %v after %d read", i, dst.Has(id), n)
			}
			if i < n {
				if _, err := dst.Get(ctx, id); err != nil {
					t.Fatalf("stored chunk %d does not read back: %v", i, err)
				}
			}
		}
	})
}
