package tier

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/index"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// PruneStats says what a Prune did.
type PruneStats struct {
	Manifests    int   // manifests deleted
	Packs        int   // packs deleted (whole, repacked or unindexed)
	Repacked     int   // of them, packs whose live chunks were copied first
	Bytes        int64 // bytes of the packs deleted
	CopiedChunks int   // chunks copied into new packs
}

// Prune deletes from the repo every manifest but keep and every chunk no
// kept manifest references, so that afterwards the repo holds exactly the
// kept images' chunks. A pack of which some chunks live is repacked: its
// live chunks are read, verified and written into new packs first. The
// order keeps the repo readable at every step, a crash included: new
// packs, then one index file of every pack that stays, then deletions
// (manifests, old index files, packs). Packs no index file lists (those
// of a flush that failed) are deleted too. A kept manifest the repo lacks
// or cannot read fails the prune before anything is deleted, as does a
// damaged live chunk (ErrCorrupt: it is left where it is).
func (r *Repo) Prune(ctx context.Context, keep []store.ID) (PruneStats, error) {
	var st PruneStats
	fail := func(err error) (PruneStats, error) { return st, fmt.Errorf("prune %s: %w", r, err) }
	if err := r.load(ctx); err != nil {
		return fail(err)
	}
	live := map[store.ID]bool{}
	for _, m := range keep {
		man, err := r.LoadManifest(ctx, m)
		if err != nil {
			return fail(err)
		}
		for _, id := range man.ChunkIDs() {
			live[id] = true
		}
	}
	r.mu.Lock()
	var stay []index.PackEntries // packs kept whole
	var copyIDs []store.ID       // live chunks of packs that go
	from := map[store.ID]loc{}
	var gone []store.ID
	for p, entries := range r.packs {
		var alive, dead int
		for _, e := range entries {
			if live[e.ID] && r.chunks[e.ID].pack == p {
				alive++
			} else {
				dead++
			}
		}
		switch {
		case dead == 0:
			stay = append(stay, index.PackEntries{Pack: p, Entries: entries})
		case alive == 0:
			gone = append(gone, p)
		default:
			gone = append(gone, p)
			st.Repacked++
			for _, e := range entries {
				if live[e.ID] && r.chunks[e.ID].pack == p {
					copyIDs = append(copyIDs, e.ID)
					from[e.ID] = loc{pack: p, Entry: e}
				}
			}
		}
	}
	for id := range live {
		if _, ok := r.chunks[id]; !ok {
			r.mu.Unlock()
			return fail(fmt.Errorf("%w: chunk %s of a kept image is in no index file", ErrCorrupt, id))
		}
	}
	oldIndex := slices.Clone(r.index)
	r.mu.Unlock()

	slices.SortFunc(copyIDs, func(a, b store.ID) int { return cmpLoc(from[a], from[b]) })
	get := func(ctx context.Context, id store.ID) (store.Blob, error) {
		l := from[id]
		b, err := r.readPack(ctx, l.pack, int64(l.Offset), int64(l.Length))
		if err != nil {
			return store.Blob{}, err
		}
		blob := store.Blob{ID: id, Data: b, RawLength: l.RawLength, Compression: l.Compression}
		if _, err := store.VerifyBlob(blob); err != nil {
			return blob, fmt.Errorf("%w: pack %s at offset %d: %w", ErrCorrupt, l.pack, l.Offset, err)
		}
		return blob, nil
	}
	copied, _, err := r.uploadPacks(ctx, copyIDs, get)
	if err != nil {
		return fail(err)
	}
	st.CopiedChunks = len(copyIDs)
	stay = append(stay, copied...)

	// One index file of every pack that stays; then the old ones go.
	newKey := ""
	if len(stay) > 0 {
		b := index.Encode(stay)
		newKey = r.key(indexDir, store.Hash(b))
		if err := r.b.Put(ctx, newKey, b); err != nil {
			return fail(err)
		}
	}
	ms, err := r.Manifests(ctx)
	if err != nil {
		return fail(err)
	}
	for _, m := range ms {
		if !slices.Contains(keep, m) {
			if err := r.b.Delete(ctx, r.key(manifestsDir, m)); err != nil {
				return fail(err)
			}
			st.Manifests++
		}
	}
	for _, k := range oldIndex {
		if k != newKey {
			if err := r.b.Delete(ctx, k); err != nil {
				return fail(err)
			}
		}
	}
	kept := map[store.ID]bool{}
	for _, p := range stay {
		kept[p.Pack] = true
	}
	objs, err := r.b.List(ctx, r.prefix+packsDir)
	if err != nil {
		return fail(err)
	}
	for _, o := range objs {
		p, err := r.idOf(o.Key, packsDir)
		if err != nil || kept[p] {
			continue // not ours to delete, or it stays
		}
		if err := r.b.Delete(ctx, o.Key); err != nil {
			return fail(err)
		}
		st.Packs++
		st.Bytes += o.Size
	}
	if err := r.load(ctx); err != nil {
		return fail(err)
	}
	return st, nil
}

func cmpLoc(a, b loc) int {
	if c := slices.Compare(a.pack[:], b.pack[:]); c != 0 {
		return c
	}
	switch {
	case a.Offset < b.Offset:
		return -1
	case a.Offset > b.Offset:
		return 1
	}
	return 0
}

// Listing reads the header of every pack object in the repo, whether an
// index file lists it or not, and returns the chunks they hold, sorted,
// with their count (a chunk held twice counts twice): what the bucket
// holds, by listing, not by the repo's own index. A pack whose header
// does not verify fails it with ErrCorrupt.
func (r *Repo) Listing(ctx context.Context) (ids []store.ID, n int, err error) {
	objs, err := r.b.List(ctx, r.prefix+packsDir)
	if err != nil {
		return nil, 0, fmt.Errorf("list %s: %w", r, err)
	}
	seen := map[store.ID]bool{}
	for _, o := range objs {
		p, err := r.idOf(o.Key, packsDir)
		if err != nil {
			return nil, 0, fmt.Errorf("list %s: %w", r, err)
		}
		entries, err := pack.ReadHeader(&objectReader{ctx: ctx, b: r.b, key: o.Key}, o.Size)
		if err != nil {
			if errors.Is(err, pack.ErrFormat) {
				err = fmt.Errorf("%w: pack %s: %w", ErrCorrupt, p, err)
			}
			return nil, 0, fmt.Errorf("list %s: %w", r, err)
		}
		for _, e := range entries {
			n++
			if !seen[e.ID] {
				seen[e.ID] = true
				ids = append(ids, e.ID)
			}
		}
	}
	slices.SortFunc(ids, func(a, b store.ID) int { return slices.Compare(a[:], b[:]) })
	return ids, n, nil
}

// objectReader reads an object by ranges: an io.ReaderAt for
// pack.ReadHeader.
type objectReader struct {
	ctx context.Context
	b   Bucket
	key string
}

func (o *objectReader) ReadAt(p []byte, off int64) (int, error) {
	b, err := o.b.GetRange(o.ctx, o.key, off, int64(len(p)))
	return copy(p, b), err
}
