package store

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/store/index"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// commit is a finished pack being committed in the background. Its pending
// map is no longer written; done is closed when id, entries and err are set.
type commit struct {
	p       *openPack
	done    chan struct{}
	id      ID
	entries []pack.Entry
	err     error
}

// maxCommits is how many finished packs may be committing at once.
const maxCommits = 2

// openPack is the pack being written, under tmp/ until it is finished.
type openPack struct {
	f       *os.File
	bw      *asyncWriter // writes to f and hash off the store's lock
	hash    *blake3.Hasher
	w       *pack.Writer
	pending map[ID]pack.Entry
}

// startCommitLocked hands the open pack to a goroutine that writes its
// header, fsyncs and renames it, so that Put goes on filling the next pack
// while the disk catches up. flushLocked waits for it and indexes it.
func (s *Store) startCommitLocked() {
	s.reapCommitsLocked()
	c := &commit{p: s.cur, done: make(chan struct{})}
	s.cur = nil
	s.commits = append(s.commits, c)
	s.commitSem <- struct{}{}
	go func() {
		defer func() { <-s.commitSem; close(c.done) }()
		c.id, c.entries, c.err = s.commitPack(c.p)
	}()
}

// reapCommitsLocked moves the packs committed so far, oldest first, from
// s.commits into the in-memory index, as finishPack does, stopping at the
// first one still running or failed (whose error Flush returns). Without
// it every Put of a long ingest would look through the pending chunks of
// every pack finished since the last Flush (a 1 GiB image of pages is 65
// packs).
func (s *Store) reapCommitsLocked() {
	n := 0
	for _, c := range s.commits {
		if !committed(c) {
			break
		}
		s.indexLocked(c)
		n++
	}
	s.commits = append(s.commits[:0], s.commits[n:]...)
}

// indexLocked adds the pack committed by c to the in-memory index and to
// the packs the next Flush writes an index file for.
func (s *Store) indexLocked(c *commit) {
	s.idx.AddPack(c.id, c.entries)
	s.unsaved = append(s.unsaved, index.PackEntries{Pack: c.id, Entries: c.entries})
}

// committed reports whether c has ended without error.
func committed(c *commit) bool {
	select {
	case <-c.done:
		return c.err == nil
	default:
		return false
	}
}

// Put stores data as a chunk unless the store already has it. It returns the
// chunk's id and whether data was written. The chunk is durable once a later
// Flush returns nil; if a Flush or a Put fails, the chunks put since the
// last successful Flush may be lost and must be put again.
func (s *Store) Put(ctx context.Context, data []byte) (ID, bool, error) {
	if err := ctx.Err(); err != nil {
		return ID{}, false, err
	}
	id := Hash(data)
	if s.opts.ReadOnly {
		return id, false, fmt.Errorf("put chunk %s: %w", id, ErrReadOnly)
	}
	if len(data) > MaxChunkSize {
		return id, false, fmt.Errorf("put chunk %s: %d bytes is above the %d byte limit", id, len(data), MaxChunkSize)
	}
	if s.Has(id) {
		return id, false, nil
	}
	blob, comp := s.codec.compress(data)

	s.gcLock.RLock()
	defer s.gcLock.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	stored, err := s.addBlobLocked(id, blob, len(data), comp)
	if err != nil {
		return id, false, fmt.Errorf("put chunk %s: %w", id, err)
	}
	return id, stored, nil
}

// addBlobLocked appends the blob of chunk id to the open pack unless the
// store has the chunk, and reports whether it did. The caller holds gcLock
// shared and mu.
func (s *Store) addBlobLocked(id ID, blob []byte, rawLength int, comp pack.Compression) (bool, error) {
	if s.closed {
		return false, ErrClosed
	}
	if s.idx.Has(id) || s.pendingLocked(id) {
		return false, nil // put concurrently
	}
	if s.cur == nil {
		p, err := s.newPack()
		if err != nil {
			return false, err
		}
		s.cur = p
	}
	e, err := s.cur.w.Add(id, blob, rawLength, comp)
	if err != nil {
		s.cur.abort()
		s.cur = nil
		return false, err
	}
	s.cur.pending[id] = e
	if s.cur.w.Size() >= uint64(s.opts.PackSize) {
		s.startCommitLocked()
	}
	return true, nil
}

// Flush finishes the open pack and writes an index file for every pack not
// yet in one, fsyncing both. When it returns nil, every chunk put before the
// call is durable.
func (s *Store) Flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.opts.ReadOnly {
		return fmt.Errorf("flush: %w", ErrReadOnly)
	}
	s.gcLock.RLock()
	defer s.gcLock.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("flush: %w", ErrClosed)
	}
	return s.flushLocked()
}

func (s *Store) flushLocked() error {
	if s.cur != nil || len(s.commits) > 0 {
		if err := s.finishPack(); err != nil {
			return fmt.Errorf("flush: %w", err)
		}
	}
	if len(s.unsaved) == 0 {
		return nil
	}
	if err := s.writeIndex(s.unsaved); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	s.unsaved = nil
	return nil
}

// writeIndex writes the entries of packs as a new index file.
func (s *Store) writeIndex(packs []index.PackEntries) error {
	b := index.Encode(packs)
	id := Hash(b)
	if err := writeFileAtomic(s.path(tmpDir), s.indexPath(id), b); err != nil {
		return fmt.Errorf("write index %s: %w", id, err)
	}
	return nil
}

// newPack creates a pack under tmp/.
func (s *Store) newPack() (*openPack, error) {
	f, err := os.CreateTemp(s.path(tmpDir), "pack-")
	if err != nil {
		return nil, fmt.Errorf("create pack: %w", err)
	}
	p := &openPack{f: f, hash: blake3.New(), pending: make(map[ID]pack.Entry)}
	p.bw = newAsyncWriter(io.MultiWriter(f, p.hash))
	p.w = pack.NewWriter(p.bw)
	return p, nil
}

// abort discards the pack and the chunks in it.
func (p *openPack) abort() {
	_ = p.bw.Close()
	_ = p.f.Close()
	_ = os.Remove(p.f.Name())
}

// finishPack commits the open pack and adds it to the in-memory index. The
// pack is then durable, but not yet in an index file.
func (s *Store) finishPack() error {
	if s.cur != nil {
		s.startCommitLocked()
	}
	var first error
	for _, c := range s.commits {
		<-c.done
		if c.err != nil {
			if first == nil {
				first = c.err
			}
			continue
		}
		s.indexLocked(c)
	}
	s.commits = nil
	return first
}

// commitPack writes p's header, fsyncs it, and moves it to its final name,
// fsyncing the directory. It returns the pack's id and entries. On error, p
// is discarded.
func (s *Store) commitPack(p *openPack) (_ ID, _ []pack.Entry, err error) {
	defer func() {
		if err != nil {
			p.abort()
		}
	}()
	entries, err := p.w.Finish()
	if err != nil {
		return ID{}, nil, fmt.Errorf("finish pack: %w", err)
	}
	if err := p.bw.Close(); err != nil {
		return ID{}, nil, fmt.Errorf("finish pack: %w", err)
	}
	if err := p.f.Sync(); err != nil {
		return ID{}, nil, fmt.Errorf("finish pack: %w", err)
	}
	var id ID
	p.hash.Sum(id[:0])
	dir := filepath.Dir(s.packPath(id))
	created, err := mkdir(dir)
	if err != nil {
		return id, nil, fmt.Errorf("finish pack %s: %w", id, err)
	}
	if created {
		if err := syncDir(s.path(packsDir)); err != nil {
			return id, nil, fmt.Errorf("finish pack %s: %w", id, err)
		}
	}
	if err := os.Rename(p.f.Name(), s.packPath(id)); err != nil {
		return id, nil, fmt.Errorf("finish pack %s: %w", id, err)
	}
	if err := syncDir(dir); err != nil {
		return id, nil, fmt.Errorf("finish pack %s: %w", id, err)
	}
	if err := p.f.Close(); err != nil {
		return id, nil, fmt.Errorf("finish pack %s: %w", id, err)
	}
	return id, entries, nil
}
