package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
)

// TestGCModel runs random sequences of ingest, pin, unpin and GC (keeping
// the newest N manifests and the pinned ones) against a model: after each
// GC, every kept manifest reads back exactly and the store holds exactly
// the chunks the kept manifests reference.
func TestGCModel(t *testing.T) {
	seeds, steps := 4, 40
	if testing.Short() {
		seeds = 2
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runGCModel(t, seed, steps) })
	}
}

func runGCModel(t *testing.T, seed uint64, steps int) {
	dir := t.TempDir()
	opts := smallPackOptions(t)
	opts.Logger = nil
	s, err := store.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 42))
	var pool [][]byte
	type manifest struct {
		id    store.ID
		files map[string][]byte
	}
	var live []manifest // oldest first
	pinned := make(map[store.ID]bool)
	for step := range steps {
		switch op := rng.IntN(10); {
		case op < 6:
			f := genFiles(rng, &pool)
			id := mustPutFiles(t, s, f)
			if !slices.ContainsFunc(live, func(m manifest) bool { return m.id == id }) {
				live = append(live, manifest{id, f})
			}
		case op < 7 && len(live) > 0:
			pinned[live[rng.IntN(len(live))].id] = true
		case op < 8 && len(pinned) > 0:
			for id := range pinned {
				delete(pinned, id)
				break
			}
		default:
			n := rng.IntN(4)
			var keep []store.ID
			var kept []manifest
			for i, m := range live {
				if i >= len(live)-n || pinned[m.id] {
					keep = append(keep, m.id)
					kept = append(kept, m)
				}
			}
			if _, err := s.GC(ctx, keep, store.GCOptions{}); err != nil {
				t.Fatalf("step %d: GC: %v", step, err)
			}
			live = kept
			want := make(map[store.ID]bool)
			for _, m := range live {
				mustReadFiles(t, s, m.id, m.files)
				m, err := s.LoadManifest(ctx, m.id)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range m.ChunkIDs() {
					want[c] = true
				}
			}
			if got := s.Stats().Chunks; got != len(want) {
				t.Fatalf("step %d: %d chunks after GC, kept manifests reference %d", step, got, len(want))
			}
			ids, err := s.Manifests(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != len(live) {
				t.Fatalf("step %d: %d manifests after GC, want %d", step, len(ids), len(live))
			}
			// Drop pins of removed manifests, and now and then start over
			// from the files on disk.
			for id := range pinned {
				if !slices.ContainsFunc(live, func(m manifest) bool { return m.id == id }) {
					delete(pinned, id)
				}
			}
			if rng.IntN(3) == 0 {
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				if s, err = store.Open(dir, opts); err != nil {
					t.Fatal(err)
				}
				if got := s.Stats().Chunks; got != len(want) {
					t.Fatalf("step %d: %d chunks after reopen, want %d", step, got, len(want))
				}
			}
		}
	}
	r, err := s.Check(ctx, store.CheckOptions{ReadData: true})
	if err != nil || !r.OK() {
		t.Fatalf("Check = %+v, %v", r, err)
	}
}
