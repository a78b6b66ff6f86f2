package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
)

// TestCrashBeforeIndex copies a store's directory while the writer has
// finished packs but not yet written their index file, as a crash would
// leave it. Open of the copy indexes the finished packs from their headers
// and drops the open pack.
func TestCrashBeforeIndex(t *testing.T) {
	dir := t.TempDir()
	opts := store.TestOptions(t)
	opts.PackSize = 256 << 10
	s, err := store.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	data := make(map[store.ID][]byte)
	for i := range 8 {
		d := randBytes(uint64(i), 100<<10)
		data[mustPut(t, s, d)] = d
	}
	if got := files(t, dir, "index"); len(got) != 0 {
		t.Fatalf("index files %v before any flush", got)
	}
	store.WaitForCommits(s) // finished packs are committed in the background
	if got := files(t, dir, "tmp"); len(got) != 1 {
		t.Fatalf("tmp/ holds %v, want the open pack", got)
	}

	crashed := copyDir(t, dir)
	r := reopen(t, crashed)
	var found int
	for id, d := range data {
		if r.Has(id) {
			found++
			mustGet(t, r, id, d)
		}
	}
	if found == 0 || found == len(data) {
		t.Errorf("%d of %d chunks survived; want those of finished packs only", found, len(data))
	}
	if got := files(t, crashed, "tmp"); len(got) != 0 {
		t.Errorf("tmp/ still holds %v", got)
	}
	if got := files(t, crashed, "index"); len(got) != 1 {
		t.Errorf("index files %v; want one for the recovered packs", got)
	}
}

// TestHalfWrittenPack plants a pack without a valid trailer under a valid
// name, as a file system that does not order rename after the data might
// leave it, and checks that Open moves it to quarantine/ and empties tmp/.
func TestHalfWrittenPack(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(dir, store.TestOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	d := randBytes(1, 50000)
	id := mustPut(t, s, d)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, files(t, dir, "packs")[0])
	b, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	half := b[:len(b)-10]
	hid := store.Hash(half).String()
	bad := filepath.Join(dir, "packs", hid[:2], hid)
	if err := os.MkdirAll(filepath.Dir(bad), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, half, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tmp", "pack-123"), half, 0o600); err != nil {
		t.Fatal(err)
	}

	s = reopen(t, dir)
	if _, err := os.Stat(bad); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("half-written pack still there: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "quarantine", hid)); err != nil || len(b) != len(half) {
		t.Errorf("half-written pack not quarantined: %v", err)
	}
	if got := files(t, dir, "tmp"); len(got) != 0 {
		t.Errorf("tmp/ still holds %v", got)
	}
	mustGet(t, s, id, d)
}

// TestDamagedIndexFile checks that Open sets a damaged index file aside and
// finds its chunks again from the pack headers.
func TestDamagedIndexFile(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(dir, store.TestOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	d := randBytes(1, 50000)
	id := mustPut(t, s, d)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	idx := filepath.Join(dir, files(t, dir, "index")[0])
	flipByte(t, idx, 20)

	s = reopen(t, dir)
	mustGet(t, s, id, d)
	got := files(t, dir, "index")
	if len(got) != 2 || !slices.ContainsFunc(got, func(p string) bool { return strings.HasSuffix(p, ".corrupt") }) {
		t.Errorf("index files %v; want the damaged one set aside and a new one", got)
	}
}

func TestRebuildIndex(t *testing.T) {
	dir := t.TempDir()
	opts := store.TestOptions(t)
	opts.PackSize = 128 << 10
	s, err := store.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	data := make(map[store.ID][]byte)
	ctx := context.Background()
	for i := range 12 {
		d := randBytes(uint64(i), 60<<10)
		data[mustPut(t, s, d)] = d
		if i%3 == 0 {
			if err := s.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.RebuildIndex(ctx); err != nil {
		t.Fatalf("RebuildIndex: %v", err)
	}
	if got := files(t, dir, "index"); len(got) != 1 {
		t.Errorf("index files after rebuild: %v", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, dir)
	for id, d := range data {
		mustGet(t, s, id, d)
	}

	// A pack whose header is damaged makes the rebuild fail, leaving the
	// index files alone.
	p := filepath.Join(dir, files(t, dir, "packs")[0])
	fi, _ := os.Stat(p)
	flipByte(t, p, fi.Size()-60)
	if err := s.RebuildIndex(ctx); err == nil || !strings.Contains(err.Error(), filepath.Base(p)) {
		t.Errorf("RebuildIndex with a damaged pack = %v, want an error naming it", err)
	}
	if got := files(t, dir, "index"); len(got) != 1 {
		t.Errorf("index files after failed rebuild: %v", got)
	}
}
