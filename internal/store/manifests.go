package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
)

// PutManifest stores m and returns its ID. It first makes every chunk put so
// far durable (Flush) and checks that the store has every chunk m references
// and that each regular file's size is the sum of its chunks' lengths; only
// then does it write the manifest. A chunk m references but the store lacks
// gives an error matching ErrNotFound; an inconsistent m, one matching
// ErrInvalidManifest. Storing a manifest that exists already writes nothing.
func (s *Store) PutManifest(ctx context.Context, m *Manifest) (ID, error) {
	if err := ctx.Err(); err != nil {
		return ID{}, err
	}
	if s.opts.ReadOnly {
		return ID{}, fmt.Errorf("put manifest: %w", ErrReadOnly)
	}
	s.gcLock.RLock() // GC must not run between the check and the write
	defer s.gcLock.RUnlock()
	b, err := m.MarshalBinary()
	if err != nil {
		return ID{}, fmt.Errorf("put manifest: %w", err)
	}
	id := Hash(b)
	if err := s.checkDurable(m); err != nil {
		return id, fmt.Errorf("put manifest %s: %w", id, err)
	}
	dst := s.manifestPath(id)
	if _, err := os.Stat(dst); err == nil {
		return id, nil
	}
	if err := writeFileAtomic(s.path(tmpDir), dst, b); err != nil {
		return id, fmt.Errorf("put manifest %s: %w", id, err)
	}
	return id, nil
}

// checkDurable flushes and checks, under the write lock, that every chunk
// of m is in the index: after the flush, every chunk there is durable. The
// caller holds gcLock.
func (s *Store) checkDurable(m *Manifest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.flushLocked(); err != nil {
		return err
	}
	for _, n := range m.Nodes {
		var size uint64
		for _, id := range n.Chunks {
			loc, ok := s.idx.Lookup(id)
			if !ok {
				return fmt.Errorf("%q: chunk %s: %w", n.Path, id, ErrNotFound)
			}
			size += uint64(loc.RawLength)
		}
		if size != n.Size {
			return fmt.Errorf("%w: %q has size %d but its chunks hold %d bytes", ErrInvalidManifest, n.Path, n.Size, size)
		}
	}
	return nil
}

// LoadManifest reads and verifies the manifest id. It returns an error
// matching ErrNotFound if there is no such manifest and a *CorruptError if
// its bytes do not hash to id or do not decode.
func (s *Store) LoadManifest(ctx context.Context, id ID) (*Manifest, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.manifestPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load manifest %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("load manifest %s: %w", id, err)
	}
	if got := Hash(b); got != id {
		return nil, &CorruptError{ID: id, Err: fmt.Errorf("content hashes to %s", got)}
	}
	var m Manifest
	if err := m.UnmarshalBinary(b); err != nil {
		return nil, &CorruptError{ID: id, Err: err}
	}
	return &m, nil
}

// Manifests returns the IDs of all stored manifests, sorted.
func (s *Store) Manifests(ctx context.Context) ([]ID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(s.path(manifestsDir))
	if err != nil {
		return nil, fmt.Errorf("list manifests: %w", err)
	}
	var ids []ID
	for _, e := range entries {
		if id, err := ParseID(e.Name()); err == nil {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b ID) int { return slices.Compare(a[:], b[:]) })
	return ids, nil
}
