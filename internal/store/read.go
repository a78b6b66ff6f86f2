package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/cairn-hpc/cairn/internal/store/index"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// Has reports whether the chunk id is stored or queued in the open pack.
func (s *Store) Has(id ID) bool {
	if s.idx.Has(id) {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pendingLocked(id)
}

// pendingLocked reports whether chunk id is in the open pack or in a pack
// being committed.
func (s *Store) pendingLocked(id ID) bool {
	_, _, ok := s.pendingEntryLocked(id)
	return ok
}

// pendingEntryLocked finds chunk id in the open pack (c == nil) or in a pack
// being committed.
func (s *Store) pendingEntryLocked(id ID) (e pack.Entry, c *commit, ok bool) {
	if s.cur != nil {
		if e, ok := s.cur.pending[id]; ok {
			return e, nil, true
		}
	}
	for _, c := range s.commits {
		if e, ok := c.p.pending[id]; ok {
			return e, c, true
		}
	}
	return pack.Entry{}, nil, false
}

// Get returns the chunk id, always verified against its hash. It returns an
// error matching ErrNotFound if the store does not have the chunk, and a
// *CorruptError if the stored bytes cannot be read, decompressed or do not
// hash to id.
func (s *Store) Get(ctx context.Context, id ID) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	_, _, data, ok, err := s.getPending(id)
	if ok || err != nil {
		return data, err
	}
	_, _, data, err = s.fetch(ctx, id)
	return data, err
}

// fetch reads chunk id from its pack and returns its location, its blob as
// stored and its verified bytes.
func (s *Store) fetch(ctx context.Context, id ID) (loc index.Location, blob, data []byte, err error) {
	loc, f, release, err := s.openChunk(ctx, id)
	if err != nil {
		return loc, nil, nil, err
	}
	defer release()
	blob, data, err = s.load(f, id, loc)
	return loc, blob, data, err
}

// fetchBlob reads chunk id's blob as stored, neither decompressed nor
// verified: for a receiver that verifies it (a chunk stream's). A blob
// that cannot be read is a *CorruptError.
func (s *Store) fetchBlob(ctx context.Context, id ID) (index.Location, []byte, error) {
	loc, f, release, err := s.openChunk(ctx, id)
	if err != nil {
		return loc, nil, err
	}
	defer release()
	blob, err := pack.Load(f, loc.Entry, nil)
	if err != nil {
		return loc, nil, &CorruptError{ID: id, Pack: loc.Pack, Offset: loc.Offset, Err: err}
	}
	return loc, blob, nil
}

// openChunk finds chunk id and opens its pack. If the pack has vanished,
// GC has moved the chunk: openChunk looks it up again (a reader reloads
// the index files first) and retries once.
func (s *Store) openChunk(ctx context.Context, id ID) (loc index.Location, f *os.File, release func(), err error) {
	loc, ok := s.idx.Lookup(id)
	if !ok {
		return loc, nil, nil, fmt.Errorf("get chunk %s: %w", id, ErrNotFound)
	}
	f, release, err = s.openPackFile(loc.Pack)
	if errors.Is(err, fs.ErrNotExist) {
		if s.opts.ReadOnly {
			if rerr := s.reloadIndex(ctx); rerr != nil {
				return loc, nil, nil, fmt.Errorf("get chunk %s: %w", id, rerr)
			}
		}
		moved, ok := s.idx.Lookup(id)
		if !ok {
			return loc, nil, nil, fmt.Errorf("get chunk %s: %w", id, ErrNotFound)
		}
		if moved.Pack != loc.Pack {
			loc = moved
			f, release, err = s.openPackFile(loc.Pack)
		}
	}
	if err != nil {
		return loc, nil, nil, &CorruptError{ID: id, Pack: loc.Pack, Offset: loc.Offset, Err: err}
	}
	return loc, f, release, nil
}

// maxOpenPacks bounds the pack file cache.
const maxOpenPacks = 64

// openPackFile returns pack id opened for reading and a release function.
func (s *Store) openPackFile(id ID) (*os.File, func(), error) {
	s.filesMu.Lock()
	defer s.filesMu.Unlock()
	if f, ok := s.files[id]; ok {
		return f, func() {}, nil
	}
	f, err := os.Open(s.packPath(id))
	if err != nil {
		return nil, func() {}, err
	}
	if s.files == nil {
		s.files = map[ID]*os.File{}
	}
	if len(s.files) >= maxOpenPacks {
		return f, func() { f.Close() }, nil
	}
	s.files[id] = f
	return f, func() {}, nil
}

func (s *Store) closePackFiles() {
	s.filesMu.Lock()
	defer s.filesMu.Unlock()
	for id, f := range s.files {
		f.Close()
		delete(s.files, id)
	}
}

// getPending reads a chunk that is still in the open pack, or in a pack
// being committed, and returns its entry, its blob and its bytes.
func (s *Store) getPending(id ID) (_ pack.Entry, blob, data []byte, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return pack.Entry{}, nil, nil, false, fmt.Errorf("get chunk %s: %w", id, ErrClosed)
	}
	e, c, ok := s.pendingEntryLocked(id)
	if !ok {
		return e, nil, nil, false, nil
	}
	if c != nil {
		<-c.done
		if c.err != nil {
			return e, nil, nil, true, fmt.Errorf("get chunk %s: %w", id, c.err)
		}
		f, err := os.Open(s.packPath(c.id))
		if err != nil {
			return e, nil, nil, true, &CorruptError{ID: id, Pack: c.id, Offset: e.Offset, Err: err}
		}
		defer f.Close()
		blob, data, err := s.load(f, id, index.Location{Pack: c.id, Entry: e})
		return e, blob, data, true, err
	}
	if err := s.cur.bw.Flush(); err != nil {
		return e, nil, nil, false, fmt.Errorf("get chunk %s: flush open pack: %w", id, err)
	}
	blob, data, err = s.load(s.cur.f, id, index.Location{Entry: e})
	return e, blob, data, true, err
}

// load reads, decompresses and verifies the blob at loc, and returns the
// blob and the chunk.
func (s *Store) load(r io.ReaderAt, id ID, loc index.Location) (blob, data []byte, err error) {
	corrupt := func(err error) error {
		return &CorruptError{ID: id, Pack: loc.Pack, Offset: loc.Offset, Err: err}
	}
	blob, err = pack.Load(r, loc.Entry, nil)
	if err != nil {
		return nil, nil, corrupt(err)
	}
	data, err = s.codec.decompress(blob, loc.RawLength, loc.Compression)
	if err != nil {
		return nil, nil, corrupt(err)
	}
	if got := Hash(data); got != id {
		return nil, nil, corrupt(fmt.Errorf("content hashes to %s", got))
	}
	return blob, data, nil
}
