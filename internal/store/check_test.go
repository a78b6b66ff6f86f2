package store_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

func TestCheck(t *testing.T) {
	ctx := context.Background()
	a := randBytes(1, 3000)         // only in manifest 1
	shared := compressible(2, 3000) // in both manifests
	setup := func(t *testing.T) (*store.Store, store.ID, store.ID, string, map[store.ID]pack.Entry) {
		t.Helper()
		s := store.TestStore(t)
		m1, err := s.PutManifest(ctx, &store.Manifest{Nodes: []store.Node{
			fileNode("a", s, a), fileNode("s", s, shared)}})
		if err != nil {
			t.Fatal(err)
		}
		m2, err := s.PutManifest(ctx, &store.Manifest{Nodes: []store.Node{fileNode("s", s, shared)}})
		if err != nil {
			t.Fatal(err)
		}
		packs := files(t, s.Dir(), "packs")
		if len(packs) != 1 {
			t.Fatalf("packs %v, want 1", packs)
		}
		path := filepath.Join(s.Dir(), packs[0])
		b, _ := os.ReadFile(path)
		es, err := pack.ReadHeader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		byID := make(map[store.ID]pack.Entry)
		for _, e := range es {
			byID[e.ID] = e
		}
		return s, m1, m2, path, byID
	}
	sorted := func(ids ...store.ID) []store.ID {
		if len(ids) == 2 && cmpID(ids[0], ids[1]) > 0 {
			ids[0], ids[1] = ids[1], ids[0]
		}
		return ids
	}
	type want struct {
		readData  bool
		ok        bool
		badChunk  []byte
		also      []byte // a second bad chunk, affecting both manifests
		affected  func(m1, m2 store.ID) []store.ID
		badPack   bool
		missing   bool
		badMan    func(m1, m2 store.ID) store.ID
		unindexed bool
	}
	tests := []struct {
		name   string
		damage func(t *testing.T, s *store.Store, m1, m2 store.ID, path string, es map[store.ID]pack.Entry)
		want   []want
	}{
		{"healthy", nil, []want{{ok: true}, {readData: true, ok: true}}},
		{"flipped blob byte", func(t *testing.T, s *store.Store, m1, m2 store.ID, path string, es map[store.ID]pack.Entry) {
			flipByte(t, path, int64(es[store.Hash(shared)].Offset)+3)
		}, []want{
			{ok: true}, // only the data is damaged
			{readData: true, badChunk: shared, badPack: true,
				affected: func(m1, m2 store.ID) []store.ID { return sorted(m1, m2) }},
		}},
		{"missing pack", func(t *testing.T, s *store.Store, m1, m2 store.ID, path string, es map[store.ID]pack.Entry) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, []want{
			{badChunk: a, also: shared, badPack: true, missing: true, affected: func(m1, m2 store.ID) []store.ID { return []store.ID{m1} }},
			{readData: true, badChunk: a, also: shared, badPack: true, missing: true, affected: func(m1, m2 store.ID) []store.ID { return []store.ID{m1} }},
		}},
		{"damaged header", func(t *testing.T, s *store.Store, m1, m2 store.ID, path string, es map[store.ID]pack.Entry) {
			fi, _ := os.Stat(path)
			flipByte(t, path, fi.Size()-pack.TrailerSize-10)
		}, []want{{badPack: true}, {readData: true, badPack: true}}},
		{"damaged manifest", func(t *testing.T, s *store.Store, m1, m2 store.ID, path string, es map[store.ID]pack.Entry) {
			flipByte(t, filepath.Join(s.Dir(), "manifests", m2.String()), 12)
		}, []want{
			{badMan: func(m1, m2 store.ID) store.ID { return m2 }},
			{readData: true, badMan: func(m1, m2 store.ID) store.ID { return m2 }},
		}},
		{"unindexed pack", func(t *testing.T, s *store.Store, m1, m2 store.ID, path string, es map[store.ID]pack.Entry) {
			b, _ := os.ReadFile(path)
			// Not a pack at all, but named like one: Check only lists it.
			b = append(b, 1)
			id := store.Hash(b).String()
			if err := os.MkdirAll(filepath.Join(s.Dir(), "packs", id[:2]), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(s.Dir(), "packs", id[:2], id), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, []want{{ok: true, unindexed: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, m1, m2, path, es := setup(t)
			if tc.damage != nil {
				tc.damage(t, s, m1, m2, path, es)
			}
			for _, w := range tc.want {
				var calls int64
				r, err := s.Check(ctx, store.CheckOptions{ReadData: w.readData, Progress: func(done, total int64) {
					calls = done
					if total != 3 {
						t.Errorf("Progress total %d, want 1 pack + 2 manifests", total)
					}
				}})
				if err != nil {
					t.Fatalf("Check(ReadData: %v): %v", w.readData, err)
				}
				if calls != 3 {
					t.Errorf("Progress reached %d of 3", calls)
				}
				if r.OK() != w.ok {
					t.Errorf("Check(ReadData: %v).OK() = %v, want %v: %+v", w.readData, r.OK(), w.ok, r)
				}
				if r.Manifests != 2 || r.Packs != 1 || r.Chunks != 2 {
					t.Errorf("Check counted %d manifests, %d packs, %d chunks; want 2, 1, 2", r.Manifests, r.Packs, r.Chunks)
				}
				if w.badChunk != nil {
					bad := r.BadChunks
					if w.also != nil {
						if len(bad) != 2 {
							t.Fatalf("BadChunks = %+v, want 2", bad)
						}
						i := slices.IndexFunc(bad, func(c store.ChunkProblem) bool { return c.ID == store.Hash(w.also) })
						if i < 0 {
							t.Fatalf("BadChunks = %+v, want chunk %s", bad, store.Hash(w.also).Short())
						}
						if diff := cmp.Diff(sortedIDs(m1, m2), bad[i].AffectedManifests); diff != "" {
							t.Errorf("AffectedManifests (-want +got):\n%s", diff)
						}
						bad = slices.Delete(slices.Clone(bad), i, i+1)
					}
					if len(bad) != 1 || bad[0].ID != store.Hash(w.badChunk) {
						t.Fatalf("BadChunks = %+v, want chunk %s", r.BadChunks, store.Hash(w.badChunk).Short())
					}
					bc := bad[0]
					if bc.Pack.String() != filepath.Base(path) || bc.Err == nil {
						t.Errorf("bad chunk in pack %s (%v), want %s", bc.Pack.Short(), bc.Err, filepath.Base(path)[:8])
					}
					if diff := cmp.Diff(w.affected(m1, m2), bc.AffectedManifests); diff != "" {
						t.Errorf("AffectedManifests (-want +got):\n%s", diff)
					}
				} else if w.missing || len(r.BadChunks) != 0 {
					if len(r.BadChunks) != 0 {
						t.Errorf("BadChunks = %+v, want none", r.BadChunks)
					}
				}
				if w.badPack != (len(r.BadPacks) == 1) || len(r.BadPacks) > 1 {
					t.Errorf("BadPacks = %+v, want bad: %v", r.BadPacks, w.badPack)
				} else if w.badPack && (r.BadPacks[0].ID.String() != filepath.Base(path) || r.BadPacks[0].Missing != w.missing) {
					t.Errorf("BadPacks = %+v, want %s, missing: %v", r.BadPacks, filepath.Base(path)[:8], w.missing)
				}
				if w.badMan != nil {
					if len(r.BadManifests) != 1 || r.BadManifests[0].ID != w.badMan(m1, m2) {
						t.Errorf("BadManifests = %+v, want %s", r.BadManifests, w.badMan(m1, m2).Short())
					}
				} else if len(r.BadManifests) != 0 {
					t.Errorf("BadManifests = %+v, want none", r.BadManifests)
				}
				if w.unindexed != (len(r.UnindexedPacks) == 1) {
					t.Errorf("UnindexedPacks = %v", r.UnindexedPacks)
				}
			}
		})
	}
}

// fileNode puts data as one chunk and returns a file node for it.
func fileNode(name string, s *store.Store, data []byte) store.Node {
	id, _, err := s.Put(context.Background(), data)
	if err != nil {
		panic(err)
	}
	return store.Node{Path: name, Kind: store.KindFile, Mode: 0o644, Size: uint64(len(data)), Chunks: []store.ID{id}}
}

func TestManifestsUsing(t *testing.T) {
	s := store.TestStore(t)
	ctx := context.Background()
	a, b := randBytes(1, 5000), randBytes(2, 5000)
	m1 := mustPutFiles(t, s, map[string][]byte{"x": a})
	m2 := mustPutFiles(t, s, map[string][]byte{"x": a, "y": b})
	tests := []struct {
		name  string
		chunk store.ID
		want  []store.ID
	}{
		{"shared", store.Hash(a[:testChunkSize]), sortedIDs(m1, m2)},
		{"one", store.Hash(b[testChunkSize:]), []store.ID{m2}},
		{"none", store.Hash([]byte("nothing")), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.ManifestsUsing(ctx, tc.chunk)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ManifestsUsing (-want +got):\n%s", diff)
			}
		})
	}
}

func sortedIDs(a, b store.ID) []store.ID {
	if cmpID(a, b) > 0 {
		return []store.ID{b, a}
	}
	return []store.ID{a, b}
}

func TestStats(t *testing.T) {
	s := store.TestStore(t)
	ctx := context.Background()
	random, squeezable := randBytes(1, 10000), compressible(2, 10000)
	for _, d := range [][]byte{random, squeezable, random} {
		mustPut(t, s, d)
	}
	// Still in the open pack.
	if stored, raw, ok := s.ChunkSize(store.Hash(random)); !ok || stored != 10000 || raw != 10000 {
		t.Errorf("ChunkSize(random) = %d, %d, %v; want 10000, 10000, true", stored, raw, ok)
	}
	if got := s.Stats(); got != (store.Stats{}) {
		t.Errorf("Stats before Flush = %+v, want zero", got)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	stored, raw, ok := s.ChunkSize(store.Hash(squeezable))
	if !ok || raw != 10000 || stored >= 1000 {
		t.Errorf("ChunkSize(compressible) = %d, %d, %v", stored, raw, ok)
	}
	if _, _, ok := s.ChunkSize(store.Hash([]byte("no"))); ok {
		t.Error("ChunkSize of an unknown chunk: ok")
	}
	want := store.Stats{Chunks: 2, Packs: 1, StoredBytes: 10000 + stored, RawBytes: 20000}
	if diff := cmp.Diff(want, s.Stats()); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}
