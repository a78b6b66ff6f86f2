package store_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
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

func chunkStream(t testing.TB, s *store.Store, ids []store.ID, version int) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := s.ExportChunks(context.Background(), &buf, ids, version); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestChunkStream: both versions of the stream carry exactly the chunks
// asked for, and a receiver refuses any other, a cut and a flipped bit.
func TestChunkStream(t *testing.T) {
	src, ids := chunkFixture(t, 64)
	for _, v := range []int{store.ChunkStreamV1, store.ChunkStreamV2} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) { testChunkStream(t, src, ids, v) })
	}
	t.Run("other version", func(t *testing.T) {
		ctx := context.Background()
		b := chunkStream(t, src, ids[:1], store.ChunkStreamV2)
		b[len(store.ChunkStreamMagic)] = 3
		if _, err := store.TestStore(t).ImportChunks(ctx, bytes.NewReader(b), ids[:1]); !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), "version 3") {
			t.Fatalf("version 3: %v", err)
		}
		if err := src.ExportChunks(ctx, io.Discard, ids[:1], 3); err == nil {
			t.Fatal("export of version 3 did not fail")
		}
	})
	t.Run("v2 checksums headers only", func(t *testing.T) {
		// The v1 stream's checksum covers the blobs, v2's does not: the
		// streams differ only in the version byte and the checksum.
		b1 := chunkStream(t, src, ids[:4], store.ChunkStreamV1)
		b2 := chunkStream(t, src, ids[:4], store.ChunkStreamV2)
		n := len(b1) - 32
		b1[len(store.ChunkStreamMagic)] = store.ChunkStreamV2
		if len(b1) != len(b2) || !bytes.Equal(b1[:n], b2[:n]) || bytes.Equal(b1[n:], b2[n:]) {
			t.Fatal("v1 and v2 streams of the same chunks differ beyond the version and the checksum")
		}
	})
}

func testChunkStream(t *testing.T, src *store.Store, ids []store.ID, version int) {
	ctx := context.Background()
	stream := chunkStream(t, src, ids[10:40], version)

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
		// A bit flipped in a chunk's bytes, in a record's header and in
		// the checksum.
		for _, at := range []int{len(stream) / 2, 12 + 5*(44+4096) + 34, len(stream) - 1} {
			b := bytes.Clone(stream)
			b[at] ^= 1
			_, err := store.TestStore(t).ImportChunks(ctx, bytes.NewReader(b), ids[10:40])
			if !errors.Is(err, store.ErrCorrupt) || errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("byte %d flipped: %v", at, err)
			}
		}
	})
	t.Run("not here", func(t *testing.T) {
		if err := src.ExportChunks(ctx, io.Discard, []store.ID{ids[0], store.Hash([]byte("x"))}, version); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("export of a chunk the store lacks: %v", err)
		}
	})
}

// TestChunkStreamSenderDamaged: a sender sends its chunks as stored,
// unverified. One whose bytes are damaged fails the receiver's check (as
// damage, not a cut); one the sender cannot read it marks damaged in the
// stream. Either way the receiver keeps what came before.
func TestChunkStreamSenderDamaged(t *testing.T) {
	ctx := context.Background()
	// damaged puts 8 random chunks into a new store, damages the last
	// one's blob in its pack with damage, and returns the store reopened
	// read-only and the chunks' ids.
	damaged := func(t *testing.T, damage func(path string, off int64, length int)) (*store.Store, []store.ID) {
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
		if err := src.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		path, off, length, ok := store.Locate(src, ids[7])
		if !ok {
			t.Fatal("chunk 7 not found")
		}
		if err := src.Close(); err != nil {
			t.Fatal(err)
		}
		damage(path, off, length)
		src, err = store.Open(dir, store.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		return src, ids
	}
	kept := func(t *testing.T, dst *store.Store, ids []store.ID, n int) {
		if n != 7 || !dst.Has(ids[6]) || dst.Has(ids[7]) {
			t.Fatalf("import kept %d chunks, want the 7 before the damaged one", n)
		}
	}

	t.Run("flipped", func(t *testing.T) {
		src, ids := damaged(t, func(path string, off int64, length int) {
			b, _ := os.ReadFile(path)
			b[off+int64(length)/2] ^= 1
			os.WriteFile(path, b, 0o600)
		})
		var buf bytes.Buffer
		if err := src.ExportChunks(ctx, &buf, ids, store.ChunkStreamV2); err != nil {
			t.Fatalf("export: %v (the sender does not verify)", err)
		}
		dst := store.TestStore(t)
		n, err := dst.ImportChunks(ctx, &buf, ids)
		if !errors.Is(err, store.ErrCorrupt) || errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "hashes to") {
			t.Fatalf("import: %v, want a chunk that does not verify", err)
		}
		kept(t, dst, ids, n)
	})
	t.Run("unreadable", func(t *testing.T) {
		src, ids := damaged(t, func(path string, off int64, length int) {
			if err := os.Truncate(path, off+int64(length)/2); err != nil {
				t.Fatal(err)
			}
		})
		var buf bytes.Buffer
		if err := src.ExportChunks(ctx, &buf, ids, store.ChunkStreamV2); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("export of an unreadable chunk: %v", err)
		}
		dst := store.TestStore(t)
		n, err := dst.ImportChunks(ctx, &buf, ids)
		if !errors.Is(err, store.ErrSenderDamaged) || !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("import: %v, want the sender's damage", err)
		}
		kept(t, dst, ids, n)
	})
}

// FuzzImportChunks: a chunk stream is hostile input; whatever it holds,
// ImportChunks stores only chunks that verify against what was asked.
func FuzzImportChunks(f *testing.F) {
	src, ids := chunkFixture(f, 4)
	for _, v := range []int{store.ChunkStreamV1, store.ChunkStreamV2} {
		stream := chunkStream(f, src, ids, v)
		f.Add(stream, uint8(4))
		f.Add(stream[:len(stream)/2], uint8(4))
		f.Add([]byte(store.ChunkStreamMagic+string(rune(v))), uint8(0))
	}
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
