package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"

	"github.com/cairn-hpc/cairn/internal/store/index"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// CheckOptions configure Check.
type CheckOptions struct {
	// ReadData makes Check read every pack in full, check that it hashes to
	// its name, and read, decompress and hash every indexed chunk.
	// Without it Check reads only pack headers and manifests.
	ReadData bool
	// Progress, if set, is called on Check's goroutine after each pack and
	// each manifest checked, with the number done and the total.
	Progress func(done, total int64)
}

// CheckReport lists what Check found. A store is healthy when OK reports
// true.
type CheckReport struct {
	// Packs, Chunks and Manifests count what was checked: the packs in the
	// index, the chunks in the index and the manifests.
	Packs, Chunks, Manifests int
	// Chunks that are damaged, or missing although a manifest references
	// them, ordered by ID.
	BadChunks []ChunkProblem
	// Packs in the index that are missing or damaged, ordered by ID.
	BadPacks []PackProblem
	// Manifests that cannot be read or decoded, ordered by ID.
	BadManifests []ManifestProblem
	// UnindexedPacks are pack files that no index lists. They are not a
	// problem in themselves (a writer indexes them when it opens the
	// store; a reader may see a GC's new packs), but their chunks cannot be
	// read until they are indexed.
	UnindexedPacks []ID
	// Quarantined are the damaged packs a writer's recovery moved to
	// quarantine/ (see Store.Quarantined). They stay there, and are
	// reported here, until an operator removes them.
	Quarantined []Quarantine
}

// ChunkProblem is a chunk that cannot be read intact.
type ChunkProblem struct {
	ID ID
	// Pack is the pack the index locates the chunk in; null if the chunk
	// is not in the index at all.
	Pack ID
	Err  error
	// AffectedManifests are the manifests that reference the chunk,
	// sorted.
	AffectedManifests []ID
}

// PackProblem is a pack in the index that is missing or damaged.
type PackProblem struct {
	ID      ID
	Missing bool
	Err     error
}

// ManifestProblem is a manifest that cannot be read or decoded.
type ManifestProblem struct {
	ID  ID
	Err error
}

// OK reports whether Check found no problem.
func (r *CheckReport) OK() bool {
	return len(r.BadChunks) == 0 && len(r.BadPacks) == 0 && len(r.BadManifests) == 0 && len(r.Quarantined) == 0
}

// Check verifies the store: every index entry against its pack's header,
// every manifest against its ID and encoding, and that every chunk a
// manifest references is indexed; with opts.ReadData also the content of
// every pack and chunk. Problems are listed in the report, not returned as
// errors: the error is for Check itself failing (ctx, I/O errors listing
// directories). Check holds a read session while it runs, so a GC does not
// delete packs under it. Chunks still in a writer's open pack are not
// checked.
func (s *Store) Check(ctx context.Context, opts CheckOptions) (CheckReport, error) {
	var r CheckReport
	if err := ctx.Err(); err != nil {
		return r, err
	}
	release, err := s.ReadSession(ctx)
	if err != nil {
		return r, fmt.Errorf("check: %w", err)
	}
	defer release()

	manifests, err := s.Manifests(ctx)
	if err != nil {
		return r, fmt.Errorf("check: %w", err)
	}
	onDisk := make(map[ID]bool)
	if err := s.walkPacks(func(id ID, _ string) error {
		onDisk[id] = true
		return nil
	}); err != nil {
		return r, fmt.Errorf("check: %w", err)
	}
	packs := s.idx.Dump()
	total := int64(len(packs) + len(manifests))
	var done int64
	step := func() {
		done++
		if opts.Progress != nil {
			opts.Progress(done, total)
		}
	}

	badChunks := make(map[ID]*ChunkProblem)
	addBad := func(id, packID ID, err error) {
		if _, ok := badChunks[id]; !ok {
			badChunks[id] = &ChunkProblem{ID: id, Pack: packID, Err: err}
		}
	}
	for _, p := range packs {
		if err := ctx.Err(); err != nil {
			return r, fmt.Errorf("check: %w", err)
		}
		r.Packs++
		r.Chunks += len(p.Entries)
		s.checkPack(p, opts.ReadData, &r, addBad)
		delete(onDisk, p.Pack)
		step()
	}
	for id := range onDisk {
		r.UnindexedPacks = append(r.UnindexedPacks, id)
	}
	if r.Quarantined, err = s.Quarantined(); err != nil {
		return r, fmt.Errorf("check: %w", err)
	}

	users := make(map[ID][]ID)
	for _, mid := range manifests {
		if err := ctx.Err(); err != nil {
			return r, fmt.Errorf("check: %w", err)
		}
		r.Manifests++
		m, err := s.LoadManifest(ctx, mid)
		if err != nil {
			r.BadManifests = append(r.BadManifests, ManifestProblem{ID: mid, Err: err})
			step()
			continue
		}
		for _, c := range m.ChunkIDs() {
			users[c] = append(users[c], mid)
			if !s.idx.Has(c) {
				addBad(c, ID{}, fmt.Errorf("chunk %s: %w", c, ErrNotFound))
			}
		}
		step()
	}
	for id, p := range badChunks {
		p.AffectedManifests = users[id]
		r.BadChunks = append(r.BadChunks, *p)
	}
	slices.SortFunc(r.BadChunks, func(a, b ChunkProblem) int { return cmpID(a.ID, b.ID) })
	slices.SortFunc(r.BadPacks, func(a, b PackProblem) int { return cmpID(a.ID, b.ID) })
	slices.SortFunc(r.UnindexedPacks, cmpID)
	return r, nil
}

// checkPack checks the index entries p of one pack against the pack file.
func (s *Store) checkPack(p index.PackEntries, readData bool, r *CheckReport, addBad func(id, pack ID, err error)) {
	id := ID(p.Pack)
	var packErrs []error
	defer func() {
		if len(packErrs) > 0 {
			r.BadPacks = append(r.BadPacks, PackProblem{ID: id, Err: fmt.Errorf("pack %s: %w", id, errors.Join(packErrs...))})
		}
	}()
	path := s.packPath(id)
	var header []pack.Entry
	var data []byte
	var err error
	if readData {
		data, err = os.ReadFile(path)
		if err == nil {
			if got := Hash(data); got != id {
				packErrs = append(packErrs, fmt.Errorf("content hashes to %s", got))
			}
			header, err = pack.ReadHeader(bytes.NewReader(data), int64(len(data)))
		}
	} else {
		header, err = readHeader(path)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		r.BadPacks = append(r.BadPacks, PackProblem{ID: id, Missing: true, Err: fmt.Errorf("pack %s: %w", id, err)})
		for _, e := range p.Entries {
			addBad(e.ID, id, fmt.Errorf("pack %s is missing", id))
		}
		return
	case err != nil:
		packErrs = append(packErrs, err)
		if data == nil {
			return
		}
		// The header is damaged but the blobs may be intact: check them
		// from the index entries below.
	}
	inHeader := make(map[pack.Entry]bool, len(header))
	for _, e := range header {
		inHeader[e] = true
	}
	for _, e := range p.Entries {
		if header != nil && !inHeader[e] {
			addBad(e.ID, id, fmt.Errorf("index entry %+v is not in the header of pack %s", e, id))
			continue
		}
		if data != nil {
			if _, _, err := s.load(bytes.NewReader(data), e.ID, index.Location{Pack: id, Entry: e}); err != nil {
				addBad(e.ID, id, err)
			}
		}
	}
}

// CheckChunks checks, without reading their blobs, that every chunk of
// ids is indexed and that the pack the index places it in exists and has a
// header that lists it: what a deleted, truncated or damaged pack breaks.
// Each pack's header is read once. It returns a problem for every chunk
// that fails, once each, in the order given; the error is for the check
// itself failing. Chunks still in a writer's open pack pass. Call it in a
// read session, so that a GC deletes no pack under it.
func (s *Store) CheckChunks(ctx context.Context, ids []ID) ([]ChunkProblem, error) {
	type header struct {
		entries map[pack.Entry]bool
		err     error
	}
	headers := make(map[ID]*header)
	seen := make(map[ID]bool, len(ids))
	var out []ChunkProblem
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		loc, ok := s.idx.Lookup(id)
		if !ok {
			s.mu.Lock()
			pending := s.pendingLocked(id)
			s.mu.Unlock()
			if !pending {
				out = append(out, ChunkProblem{ID: id, Err: fmt.Errorf("chunk %s: %w", id, ErrNotFound)})
			}
			continue
		}
		p := ID(loc.Pack)
		h := headers[p]
		if h == nil {
			h = &header{}
			entries, err := readHeader(s.packPath(p))
			if errors.Is(err, fs.ErrNotExist) {
				h.err = fmt.Errorf("pack %s is missing", p)
			} else if err != nil {
				h.err = fmt.Errorf("pack %s: %w", p, err)
			}
			h.entries = make(map[pack.Entry]bool, len(entries))
			for _, e := range entries {
				h.entries[e] = true
			}
			headers[p] = h
		}
		switch {
		case h.err != nil:
			out = append(out, ChunkProblem{ID: id, Pack: p, Err: h.err})
		case !h.entries[loc.Entry]:
			out = append(out, ChunkProblem{ID: id, Pack: p, Err: fmt.Errorf("chunk %s is not in the header of pack %s", id, p)})
		}
	}
	return out, nil
}

// ManifestsUsing returns the IDs of the manifests that reference chunk,
// sorted. Manifests that cannot be read are skipped (Check reports them).
func (s *Store) ManifestsUsing(ctx context.Context, chunk ID) ([]ID, error) {
	ids, err := s.Manifests(ctx)
	if err != nil {
		return nil, fmt.Errorf("manifests using %s: %w", chunk, err)
	}
	var out []ID
	for _, id := range ids {
		m, err := s.LoadManifest(ctx, id)
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("manifests using %s: %w", chunk, err)
		}
		if m.uses(chunk) {
			out = append(out, id)
		}
	}
	return out, nil
}

// uses reports whether m references chunk.
func (m *Manifest) uses(chunk ID) bool {
	for _, n := range m.Nodes {
		if slices.Contains(n.Chunks, chunk) {
			return true
		}
	}
	return false
}

func cmpID(a, b ID) int { return bytes.Compare(a[:], b[:]) }
