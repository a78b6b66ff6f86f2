package store_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
)

func TestGetSeq(t *testing.T) {
	ctx := context.Background()
	opts := store.TestOptions(t)
	opts.PackSize = 64 << 10 // many packs, runs split at pack ends
	dir := t.TempDir()
	s, err := store.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var ids []store.ID
	var want [][]byte
	for i := range 200 {
		d := randBytes(uint64(i%150), 4096) // repeats: the same chunk twice in ids
		ids = append(ids, mustPut(t, s, d))
		want = append(want, d)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// One more, still pending in the open pack.
	d := randBytes(999, 1000)
	ids, want = append(ids, mustPut(t, s, d)), append(want, d)

	var got [][]byte
	if err := s.GetSeq(ctx, ids, func(b []byte) error { got = append(got, bytes.Clone(b)); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d chunks, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("chunk %d differs", i)
		}
	}

	stop := errors.New("stop")
	n := 0
	if err := s.GetSeq(ctx, ids, func([]byte) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Fatalf("fn error: %v after %d calls", err, n)
	}
	if err := s.GetSeq(ctx, []store.ID{store.Hash([]byte("absent"))}, func([]byte) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown chunk: %v", err)
	}

	// A flipped byte in a pack: ErrCorrupt naming a chunk.
	packs, _ := filepath.Glob(filepath.Join(dir, "packs", "*", "*"))
	b, _ := os.ReadFile(packs[0])
	b[10] ^= 1
	os.WriteFile(packs[0], b, 0o600)
	s.Close()
	s2, err := store.Open(dir, store.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	err = s2.GetSeq(ctx, ids, func([]byte) error { return nil })
	var ce *store.CorruptError
	if !errors.As(err, &ce) {
		t.Fatalf("damaged pack: %v, want a CorruptError", err)
	}
}
