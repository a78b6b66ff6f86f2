package index

import (
	"cmp"
	"maps"
	"slices"
	"sync"

	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// Location says where a chunk is stored.
type Location struct {
	// Pack is the id of the pack file holding the blob.
	Pack [32]byte
	pack.Entry
}

// Index maps chunk ids to locations. It is safe for concurrent use.
type Index struct {
	mu    sync.RWMutex
	byID  map[[32]byte]Location
	packs map[[32]byte]struct{}
	aside map[blobRef]struct{} // damaged blobs, never indexed again
}

// blobRef names one stored copy of a chunk: the chunk and its pack.
type blobRef struct{ id, pack [32]byte }

// New returns an empty Index.
func New() *Index {
	return &Index{byID: make(map[[32]byte]Location), packs: make(map[[32]byte]struct{}), aside: make(map[blobRef]struct{})}
}

// AddPack records the entries of the pack packID. A chunk already in the
// index keeps its first location: any copy of a chunk will do. Blobs set
// aside are skipped.
func (x *Index) AddPack(packID [32]byte, entries []pack.Entry) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.packs[packID] = struct{}{}
	for _, e := range entries {
		if _, ok := x.byID[e.ID]; ok {
			continue
		}
		if _, bad := x.aside[blobRef{e.ID, packID}]; !bad {
			x.byID[e.ID] = Location{Pack: packID, Entry: e}
		}
	}
}

// SetAside records that the blob of chunk id in pack packID is damaged:
// Lookup stops returning it, and AddPack and Replace skip it from now on,
// so that a good copy stored later in another pack takes its place.
func (x *Index) SetAside(id, packID [32]byte) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.aside[blobRef{id, packID}] = struct{}{}
	if loc, ok := x.byID[id]; ok && loc.Pack == packID {
		delete(x.byID, id)
	}
}

// Lookup returns the location of chunk id.
func (x *Index) Lookup(id [32]byte) (Location, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	loc, ok := x.byID[id]
	return loc, ok
}

// Has reports whether chunk id is in the index.
func (x *Index) Has(id [32]byte) bool {
	_, ok := x.Lookup(id)
	return ok
}

// HasPack reports whether the entries of pack packID were added.
func (x *Index) HasPack(packID [32]byte) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	_, ok := x.packs[packID]
	return ok
}

// Len returns the number of chunks in the index.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byID)
}

// Packs returns the ids of the packs in the index, sorted.
func (x *Index) Packs() [][32]byte {
	x.mu.RLock()
	defer x.mu.RUnlock()
	ids := make([][32]byte, 0, len(x.packs))
	for id := range x.packs {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b [32]byte) int { return cmpID(a, b) })
	return ids
}

// Dump returns the index's locations grouped by pack, in the canonical order
// of Encode. A pack whose chunks all have a location in another pack appears
// with no entries.
func (x *Index) Dump() []PackEntries {
	x.mu.RLock()
	byPack := make(map[[32]byte][]pack.Entry, len(x.packs))
	for id := range x.packs {
		byPack[id] = nil
	}
	for _, loc := range x.byID {
		byPack[loc.Pack] = append(byPack[loc.Pack], loc.Entry)
	}
	x.mu.RUnlock()
	out := make([]PackEntries, 0, len(byPack))
	for id, entries := range byPack {
		out = append(out, PackEntries{Pack: id, Entries: entries})
	}
	canonicalize(out)
	return out
}

func cmpID(a, b [32]byte) int {
	for i := range a {
		if c := cmp.Compare(a[i], b[i]); c != 0 {
			return c
		}
	}
	return 0
}

// Replace discards the index's contents and records packs instead, as
// AddPack would one by one, in a single step: a concurrent Lookup sees
// either the old contents or the new ones.
func (x *Index) Replace(packs []PackEntries) {
	x.mu.RLock()
	aside := maps.Clone(x.aside)
	x.mu.RUnlock()
	byID := make(map[[32]byte]Location)
	ids := make(map[[32]byte]struct{}, len(packs))
	for _, p := range packs {
		ids[p.Pack] = struct{}{}
		for _, e := range p.Entries {
			if _, ok := byID[e.ID]; ok {
				continue
			}
			if _, bad := aside[blobRef{e.ID, p.Pack}]; !bad {
				byID[e.ID] = Location{Pack: p.Pack, Entry: e}
			}
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.byID, x.packs = byID, ids
}

// Totals returns the sum of the stored and of the raw lengths of the
// chunks in the index, each chunk counted once.
func (x *Index) Totals() (stored, raw uint64) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, loc := range x.byID {
		stored += uint64(loc.Length)
		raw += uint64(loc.RawLength)
	}
	return stored, raw
}
