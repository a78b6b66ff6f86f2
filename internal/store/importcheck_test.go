package store_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/store"
)

// TestImportCheck: ImportOptions.Check sees the meta and the manifests
// before any chunk, and a refusal stores nothing.
func TestImportCheck(t *testing.T) {
	file, ids, _ := exportFixture(t)
	ctx := context.Background()
	refused := errors.New("not this one")
	var gotMeta string
	var gotIDs []store.ID
	var nodes int
	dst := store.TestStore(t)
	_, _, err := dst.Import(ctx, bytes.NewReader(file), store.ImportOptions{Check: func(meta []byte, mids []store.ID, ms []*store.Manifest) error {
		gotMeta, gotIDs = string(meta), mids
		for _, m := range ms {
			nodes += len(m.Nodes)
		}
		return refused
	}})
	if !errors.Is(err, store.ErrCorrupt) || !errors.Is(err, refused) {
		t.Fatalf("Import refused by Check = %v, want ErrCorrupt wrapping Check's error", err)
	}
	if gotMeta != "meta" || nodes == 0 {
		t.Errorf("Check saw meta %q and %d nodes", gotMeta, nodes)
	}
	if diff := cmp.Diff(ids[:2], gotIDs); diff != "" {
		t.Errorf("Check saw manifests (-want +got):\n%s", diff)
	}
	if st := dst.Stats(); st.Chunks != 0 {
		t.Errorf("a refused import stored %d chunks", st.Chunks)
	}
	if ms, _ := dst.Manifests(ctx); len(ms) != 0 {
		t.Errorf("a refused import stored manifests %v", ms)
	}
	if _, _, err := dst.Import(ctx, bytes.NewReader(file), store.ImportOptions{Check: func([]byte, []store.ID, []*store.Manifest) error { return nil }}); err != nil {
		t.Fatalf("Import passed by Check = %v", err)
	}
}

// TestCheckChunks: chunks in a deleted or truncated pack, or in none, are
// reported without reading any blob; the others pass.
func TestCheckChunks(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := store.TestOptions(t)
	s, err := store.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var ids []store.ID
	for i := range 3 {
		ids = append(ids, mustPut(t, s, randBytes(uint64(200+i), 30000)))
		if err := s.Flush(ctx); err != nil { // a pack each
			t.Fatal(err)
		}
	}
	if bad, err := s.CheckChunks(ctx, append(ids, ids[0])); err != nil || len(bad) != 0 {
		t.Fatalf("CheckChunks of a healthy store = %v, %v", bad, err)
	}
	p0, _, _, _ := store.Locate(s, ids[0])
	p1, _, _, _ := store.Locate(s, ids[1])
	if err := os.Remove(p0); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p1)
	if err := os.Truncate(p1, fi.Size()-1); err != nil {
		t.Fatal(err)
	}
	absent := store.Hash([]byte("absent"))
	bad, err := s.CheckChunks(ctx, []store.ID{ids[0], ids[1], ids[2], absent, ids[0]})
	if err != nil {
		t.Fatal(err)
	}
	var got []store.ID
	for _, b := range bad {
		got = append(got, b.ID)
	}
	if diff := cmp.Diff([]store.ID{ids[0], ids[1], absent}, got); diff != "" {
		t.Errorf("CheckChunks reported (-want +got):\n%s", diff)
	}
	if len(bad) == 3 && (bad[0].Pack.String() != filepath.Base(p0) || !errors.Is(bad[2].Err, store.ErrNotFound)) {
		t.Errorf("CheckChunks problems %+v", bad)
	}
}
