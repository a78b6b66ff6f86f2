package store_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// unindexedPack puts n chunks of size bytes (incompressible) into a new
// store as one pack, then removes the index files, as a crash right after
// the pack was renamed into place would leave the store. It returns the
// store's dir, the pack's path, its entries and the chunks by id.
func unindexedPack(t *testing.T, n, size int) (dir, path string, entries []pack.Entry, data map[store.ID][]byte) {
	t.Helper()
	dir = t.TempDir()
	s, err := store.Open(dir, store.TestOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	data = map[store.ID][]byte{}
	for i := range n {
		d := randBytes(uint64(100+i), size)
		data[mustPut(t, s, d)] = d
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	packs := files(t, dir, "packs")
	if len(packs) != 1 {
		t.Fatalf("packs %v, want 1", packs)
	}
	path = filepath.Join(dir, packs[0])
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if entries, err = pack.ReadHeader(bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	for _, f := range files(t, dir, "index") {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return dir, path, entries, data
}

// TestRecoverQuarantinesDamagedPack: a writer's recovery that finds an
// unindexed pack damaged moves it to quarantine/ instead of deleting it,
// stores again every blob of it that still verifies, and reports the pack
// with what was salvaged and lost.
func TestRecoverQuarantinesDamagedPack(t *testing.T) {
	tests := []struct {
		name           string
		damage         func(t *testing.T, path string, es []pack.Entry)
		salvaged, lost int
		lostChunk      int // index of the entry whose chunk is lost, -1 for all
	}{
		{"blob", func(t *testing.T, path string, es []pack.Entry) {
			flipByte(t, path, int64(es[1].Offset)+17)
		}, 3, 1, 1},
		{"header", func(t *testing.T, path string, es []pack.Entry) {
			fi, _ := os.Stat(path)
			// The stored length of the last entry.
			flipByte(t, path, fi.Size()-int64(pack.TrailerSize)-int64(pack.EntrySize)+40)
		}, 3, 1, 3},
		{"truncated", func(t *testing.T, path string, es []pack.Entry) {
			fi, _ := os.Stat(path)
			if err := os.Truncate(path, fi.Size()-10); err != nil {
				t.Fatal(err)
			}
		}, 0, -1, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir, path, es, data := unindexedPack(t, 4, 20000)
			packID := mustParseID(t, filepath.Base(path))
			tc.damage(t, path, es)
			damaged, _ := os.ReadFile(path)

			s := reopen(t, dir)
			q := filepath.Join(dir, "quarantine", packID.String())
			if b, err := os.ReadFile(q); err != nil || !bytes.Equal(b, damaged) {
				t.Fatalf("quarantined pack: %v (%d bytes, want the %d damaged ones)", err, len(b), len(damaged))
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("damaged pack still among the packs: %v", err)
			}
			for i, e := range es {
				id := store.ID(e.ID)
				lost := tc.lostChunk == -1 || i == tc.lostChunk
				if s.Has(id) == lost {
					t.Errorf("chunk %d of the pack: Has = %v, want %v", i, s.Has(id), !lost)
				}
				if !lost {
					mustGet(t, s, id, data[id])
				}
			}

			qs, err := s.Quarantined()
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range qs {
				if q.Reason == "" || q.Time.IsZero() {
					t.Errorf("quarantine report without reason or time: %+v", q)
				}
			}
			want := []store.Quarantine{{Pack: packID, File: packID.String(), Salvaged: tc.salvaged, Lost: tc.lost}}
			if diff := cmp.Diff(want, qs, cmpopts.IgnoreFields(store.Quarantine{}, "Reason", "Time")); diff != "" {
				t.Errorf("Quarantined (-want +got):\n%s", diff)
			}
			var qe *store.QuarantineError
			if err := s.QuarantineErr(); !errors.As(err, &qe) || !errors.Is(err, store.ErrCorrupt) || len(qe.Packs) != 1 {
				t.Errorf("QuarantineErr = %v, want a *QuarantineError matching ErrCorrupt for the one pack", err)
			}

			// A second writer finds nothing new to quarantine and keeps
			// the quarantined pack and the salvaged chunks.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = reopen(t, dir)
			if err := s.QuarantineErr(); err != nil {
				t.Errorf("second Open quarantined again: %v", err)
			}
			if _, err := os.Stat(q); err != nil {
				t.Errorf("quarantined pack gone after a second Open: %v", err)
			}
			for id, d := range data {
				if s.Has(id) {
					mustGet(t, s, id, d)
				}
			}
		})
	}
}

func mustParseID(t *testing.T, s string) store.ID {
	t.Helper()
	id, err := store.ParseID(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
