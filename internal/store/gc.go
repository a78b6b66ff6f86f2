package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/cairn-hpc/cairn/internal/store/index"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// RemoveManifest deletes the manifest id. Its chunks stay in the store
// until a GC finds that no remaining manifest references them. It returns
// an error matching ErrNotFound if there is no such manifest.
func (s *Store) RemoveManifest(ctx context.Context, id ID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.opts.ReadOnly {
		return fmt.Errorf("remove manifest %s: %w", id, ErrReadOnly)
	}
	s.gcLock.RLock()
	defer s.gcLock.RUnlock()
	if err := s.checkOpen(); err != nil {
		return fmt.Errorf("remove manifest %s: %w", id, err)
	}
	err := os.Remove(s.manifestPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove manifest %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("remove manifest %s: %w", id, err)
	}
	if err := syncDir(s.path(manifestsDir)); err != nil {
		return fmt.Errorf("remove manifest %s: %w", id, err)
	}
	return nil
}

func (s *Store) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

// GCOptions configure GC. The zero value rewrites every pack that holds an
// unreferenced chunk.
type GCOptions struct {
	// RepackThreshold: a pack holding both live and dead chunks is
	// rewritten if the live chunks make up less than this fraction of its
	// blob bytes; 0 means that every pack with a dead chunk is rewritten.
	// A pack with no live chunk is always deleted.
	RepackThreshold float64
	// Progress, if set, is called on GC's goroutine after each pack that is
	// rewritten or deleted, with the number of such packs done and the
	// total.
	Progress func(done, total int64)
}

// GCStats say what a GC did.
type GCStats struct {
	// ManifestsRemoved is the number of manifests deleted because keep did
	// not list them.
	ManifestsRemoved int
	// ChunksRemoved is the number of chunks the store no longer has.
	ChunksRemoved int
	// PacksRewritten counts the deleted packs whose live chunks were first
	// copied to new packs; PacksDeleted counts every deleted pack,
	// including those with no live chunk; PacksWritten counts new packs.
	PacksRewritten, PacksDeleted, PacksWritten int
	// BytesBefore and BytesAfter are the total sizes of the pack files.
	BytesBefore, BytesAfter int64
}

// GC removes every manifest not listed in keep and reclaims the space of
// the chunks that no kept manifest references. It fails, changing nothing,
// if a kept manifest is missing (ErrNotFound), damaged (ErrCorrupt) or
// references a chunk the store lacks (ErrNotFound): run Check.
//
// GC repacks: the live chunks of packs selected by opts.RepackThreshold
// are copied, verified, into new packs; the new packs and an index file
// listing every remaining pack are made durable; only then are the old
// index files and packs deleted. A crash at any point leaves a store that
// opens with every kept manifest complete; space not yet reclaimed is
// reclaimed by the next GC.
//
// Writes on this Store (Put, Flush, PutManifest, RemoveManifest, Import)
// wait while GC runs; Get does not. Before deleting packs, GC waits for the
// read sessions of every process to end (ReadSession), or until ctx is
// done. A chunk that Put deduplicated before GC began and that no manifest
// referenced yet may be reclaimed: a PutManifest that needs it then fails
// with ErrNotFound and the checkpoint must be written again. So GC is best
// run when no checkpoint is being written.
func (s *Store) GC(ctx context.Context, keep []ID, opts GCOptions) (GCStats, error) {
	var st GCStats
	if err := ctx.Err(); err != nil {
		return st, err
	}
	if s.opts.ReadOnly {
		return st, fmt.Errorf("gc: %w", ErrReadOnly)
	}
	s.gcLock.Lock()
	defer s.gcLock.Unlock()
	if err := s.flushForGC(); err != nil {
		return st, fmt.Errorf("gc: %w", err)
	}

	// Mark: the chunks of the kept manifests.
	keepSet := make(map[ID]bool, len(keep))
	live := make(map[ID]bool)
	for _, id := range keep {
		if keepSet[id] {
			continue
		}
		keepSet[id] = true
		m, err := s.LoadManifest(ctx, id)
		if err != nil {
			return st, fmt.Errorf("gc: keep: %w", err)
		}
		for _, n := range m.Nodes {
			for _, c := range n.Chunks {
				if !s.idx.Has(c) {
					return st, fmt.Errorf("gc: keep manifest %s: chunk %s: %w", id, c, ErrNotFound)
				}
				live[c] = true
			}
		}
	}

	// Plan, before changing anything: which packs to rewrite.
	var keptPacks []index.PackEntries
	var rewrite []gcPack
	chunksBefore := s.idx.Len()
	for _, pid := range s.idx.Packs() {
		if err := ctx.Err(); err != nil {
			return st, fmt.Errorf("gc: %w", err)
		}
		p := gcPack{id: pid}
		path := s.packPath(pid)
		fi, err := os.Stat(path)
		if err == nil {
			p.size = fi.Size()
			st.BytesBefore += p.size
			if p.entries, err = readHeader(path); err != nil {
				return st, fmt.Errorf("gc: pack %s: %w", pid, err)
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return st, fmt.Errorf("gc: %w", err)
		}
		var liveBytes, allBytes uint64
		for _, e := range p.entries {
			allBytes += uint64(e.Length)
			if loc, _ := s.idx.Lookup(e.ID); live[e.ID] && loc.Pack == pid && loc.Entry == e {
				p.live = append(p.live, e)
				liveBytes += uint64(e.Length)
			}
		}
		if p.entries == nil {
			// A missing pack: it may go only if none of its chunks is live.
			for c := range live {
				if loc, _ := s.idx.Lookup(c); loc.Pack == pid {
					return st, fmt.Errorf("gc: pack %s of chunk %s is missing: %w", pid, c, ErrCorrupt)
				}
			}
		}
		dead := len(p.entries) - len(p.live)
		switch {
		case p.entries == nil || len(p.live) == 0:
			rewrite = append(rewrite, p)
		case dead > 0 && (opts.RepackThreshold <= 0 || float64(liveBytes) < opts.RepackThreshold*float64(allBytes)):
			rewrite = append(rewrite, p)
		default:
			keptPacks = append(keptPacks, index.PackEntries{Pack: pid, Entries: p.entries})
		}
	}

	// Sweep manifests. Their chunks are dead from now on, whatever happens.
	names, err := s.Manifests(ctx)
	if err != nil {
		return st, fmt.Errorf("gc: %w", err)
	}
	for _, id := range names {
		if keepSet[id] {
			continue
		}
		if err := os.Remove(s.manifestPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return st, fmt.Errorf("gc: remove manifest %s: %w", id, err)
		}
		st.ManifestsRemoved++
	}
	if st.ManifestsRemoved > 0 {
		if err := syncDir(s.path(manifestsDir)); err != nil {
			return st, fmt.Errorf("gc: %w", err)
		}
	}
	if len(rewrite) == 0 {
		st.BytesAfter = st.BytesBefore
		return st, nil
	}

	// Copy the live chunks of the packs to rewrite into new packs.
	written, err := s.copyLive(ctx, rewrite, opts.Progress)
	if err != nil {
		return st, fmt.Errorf("gc: %w", err)
	}
	for _, p := range written {
		st.PacksWritten++
		fi, err := os.Stat(s.packPath(p.Pack))
		if err != nil {
			return st, fmt.Errorf("gc: %w", err)
		}
		st.BytesAfter += fi.Size()
	}
	for _, p := range keptPacks {
		fi, err := os.Stat(s.packPath(p.Pack))
		if err != nil {
			return st, fmt.Errorf("gc: %w", err)
		}
		st.BytesAfter += fi.Size()
	}

	// Make the new packs reachable: one index file listing every pack that
	// remains, then swap the in-memory index.
	oldIndex, err := os.ReadDir(s.path(indexDir))
	if err != nil {
		return st, fmt.Errorf("gc: %w", err)
	}
	remaining := append(keptPacks, written...)
	b := index.Encode(remaining)
	newIndex := Hash(b)
	if err := writeFileAtomic(s.path(tmpDir), s.indexPath(newIndex), b); err != nil {
		return st, fmt.Errorf("gc: write index %s: %w", newIndex, err)
	}
	s.idx.Replace(remaining)
	st.ChunksRemoved = chunksBefore - s.idx.Len()

	// Delete: first the old index files, so that no index file lists a
	// deleted pack, then the packs. Readers must not be between an index
	// lookup and a read meanwhile.
	readers, err := lockReaders(ctx, s.dir, lockExclusive)
	if err != nil {
		return st, fmt.Errorf("gc: wait for readers: %w", err)
	}
	defer readers.Close()
	for _, e := range oldIndex {
		if id, err := ParseID(e.Name()); err != nil || id == newIndex {
			continue
		}
		if err := os.Remove(s.path(indexDir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return st, fmt.Errorf("gc: remove index %s: %w", e.Name(), err)
		}
	}
	if err := syncDir(s.path(indexDir)); err != nil {
		return st, fmt.Errorf("gc: %w", err)
	}
	dirs := make(map[string]bool)
	for _, p := range rewrite {
		path := s.packPath(p.id)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return st, fmt.Errorf("gc: remove pack %s: %w", p.id, err)
		}
		dirs[filepath.Dir(path)] = true
		st.PacksDeleted++
		if len(p.live) > 0 {
			st.PacksRewritten++
		}
	}
	for _, d := range slices.Sorted(maps.Keys(dirs)) {
		if err := syncDir(d); err != nil {
			return st, fmt.Errorf("gc: %w", err)
		}
	}
	s.log.Info("garbage collected", "manifests", st.ManifestsRemoved, "chunks", st.ChunksRemoved,
		"packs_deleted", st.PacksDeleted, "packs_written", st.PacksWritten,
		"bytes_before", st.BytesBefore, "bytes_after", st.BytesAfter)
	return st, nil
}

// flushForGC makes every chunk put so far durable and in an index file.
func (s *Store) flushForGC() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return s.flushLocked()
}

// gcPack is a pack GC found in the index.
type gcPack struct {
	id      ID
	size    int64
	entries []pack.Entry // from the header; nil if the file is missing
	live    []pack.Entry // the entries to keep
}

// copyLive copies the live entries of packs, verified, into new packs and
// returns those. The new packs are durable but in no index file.
func (s *Store) copyLive(ctx context.Context, packs []gcPack, progress func(done, total int64)) (_ []index.PackEntries, err error) {
	var written []index.PackEntries
	var out *openPack
	defer func() {
		if out != nil {
			out.abort()
		}
	}()
	commit := func() error {
		id, entries, err := s.commitPack(out)
		out = nil
		if err != nil {
			return err
		}
		written = append(written, index.PackEntries{Pack: id, Entries: entries})
		return nil
	}
	for i, p := range packs {
		if len(p.live) > 0 {
			if err := s.copyPack(ctx, p, &out, commit); err != nil {
				return nil, err
			}
		}
		if progress != nil {
			progress(int64(i+1), int64(len(packs)))
		}
	}
	if out != nil {
		if err := commit(); err != nil {
			return nil, err
		}
	}
	return written, nil
}

// copyPack appends the live blobs of p to *out, starting a new pack when
// needed and calling commit when one is full.
func (s *Store) copyPack(ctx context.Context, p gcPack, out **openPack, commit func() error) error {
	f, err := os.Open(s.packPath(p.id))
	if err != nil {
		return fmt.Errorf("copy pack %s: %w", p.id, err)
	}
	defer f.Close()
	for _, e := range p.live {
		if err := ctx.Err(); err != nil {
			return err
		}
		blob, _, err := s.load(f, e.ID, index.Location{Pack: p.id, Entry: e})
		if err != nil {
			return err // a *CorruptError: GC will not spread damage
		}
		if *out == nil {
			if *out, err = s.newPack(); err != nil {
				return err
			}
		}
		if _, err := (*out).w.Add(e.ID, blob, int(e.RawLength), e.Compression); err != nil {
			return fmt.Errorf("copy chunk %s: %w", ID(e.ID), err)
		}
		if (*out).w.Size() >= uint64(s.opts.PackSize) {
			if err := commit(); err != nil {
				return err
			}
		}
	}
	return nil
}
