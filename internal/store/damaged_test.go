package store_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// TestScrubRepair: a damaged chunk is found by Scrub and set aside; a good
// copy put afterwards takes its place for the writer, for a reader, after
// a reopen, and after a GC that repacks the damaged pack away.
func TestScrubRepair(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := store.Open(dir, store.TestOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	data := randBytes(7, 6*testChunkSize)
	want := map[string][]byte{"f": data}
	mid := mustPutFiles(t, s, want)
	ids := slices.Collect(func(yield func(store.ID) bool) {
		for id := range chunksOf(t, s, mid) {
			if !yield(id) {
				return
			}
		}
	})
	packs := files(t, dir, "packs")
	if len(packs) != 1 {
		t.Fatalf("packs %v, want 1", packs)
	}
	path := filepath.Join(dir, packs[0])
	b, _ := os.ReadFile(path)
	es, err := pack.ReadHeader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	victim := es[2]
	flipByte(t, path, int64(victim.Offset)+100)
	good := data[:0]
	for off := 0; off < len(data); off += testChunkSize {
		if store.Hash(data[off:off+testChunkSize]) == store.ID(victim.ID) {
			good = data[off : off+testChunkSize]
		}
	}
	if len(good) == 0 {
		t.Fatal("victim chunk not found in the data")
	}

	bad, err := s.Scrub(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 1 || bad[0] != store.ID(victim.ID) {
		t.Fatalf("Scrub set aside %v, want [%s]", bad, store.ID(victim.ID).Short())
	}
	if s.Has(store.ID(victim.ID)) {
		t.Fatal("a set-aside chunk is still reported as held")
	}
	if _, err := s.Get(ctx, store.ID(victim.ID)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of a set-aside chunk = %v, want ErrNotFound", err)
	}
	// A second scrub finds nothing more; intact chunks were not touched.
	if again, err := s.Scrub(ctx, ids); err != nil || len(again) != 0 {
		t.Fatalf("second Scrub = %v, %v; want nothing", again, err)
	}
	// A reader opened now does not see the damaged copy either.
	r, err := store.Open(dir, store.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Has(store.ID(victim.ID)) {
		t.Error("a reader sees the set-aside chunk")
	}
	r.Close()

	// The good copy arrives (as a peer's Import would put it).
	if _, stored, err := s.Put(ctx, good); err != nil || !stored {
		t.Fatalf("Put of the good copy: stored %v, %v", stored, err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	mustReadFiles(t, s, mid, want)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{true, false} {
		s, err = store.Open(dir, store.Options{ReadOnly: ro})
		if err != nil {
			t.Fatal(err)
		}
		mustReadFiles(t, s, mid, want)
		if ro {
			s.Close()
		}
	}
	// GC repacks the damaged pack: the set-aside blob counts as dead.
	if _, err := s.GC(ctx, []store.ID{mid}, store.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Check(ctx, store.CheckOptions{ReadData: true})
	if err != nil || !rep.OK() {
		t.Fatalf("Check after GC: %+v, %v", rep, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The next writer forgets set-aside blobs whose pack is gone.
	s, err = store.Open(dir, store.TestOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustReadFiles(t, s, mid, want)
	if _, err := os.Stat(filepath.Join(dir, "damaged")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("damaged list still there after GC removed its pack: %v", err)
	}
}

// TestScrubReadOnly: a reader cannot set anything aside.
func TestScrubReadOnly(t *testing.T) {
	s := store.TestStore(t)
	mustPutFiles(t, s, map[string][]byte{"f": randBytes(1, 100)})
	r, err := store.Open(s.Dir(), store.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Scrub(context.Background(), nil); !errors.Is(err, store.ErrReadOnly) {
		t.Fatalf("Scrub on a reader = %v, want ErrReadOnly", err)
	}
}
