package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// damagedFile lists the stored blobs that were found damaged and set
// aside: one line "CHUNK PACK" (hex ids) each. See docs/format.md.
const damagedFile = "damaged"

// blobRef names one stored copy of a chunk.
type blobRef struct{ Chunk, Pack ID }

// Scrub reads every chunk of ids that the store has and sets aside each
// stored copy that does not read back intact (a *CorruptError: bytes that
// do not hash to the id, do not decompress, or a pack that cannot be
// read). A chunk set aside is no longer in the store as far as Has, Get
// and Put are concerned, so the next Put or Import of a good copy stores
// it again, in a new pack, and the index points there from then on, across
// restarts. The damaged blob itself stays in its pack until a GC repacks
// it away. Scrub returns the ids set aside; chunks the store lacks, or
// still holds in its open pack, are not reported.
func (s *Store) Scrub(ctx context.Context, ids []ID) ([]ID, error) {
	if s.opts.ReadOnly {
		return nil, fmt.Errorf("scrub: %w", ErrReadOnly)
	}
	var bad []blobRef
	seen := make(map[ID]bool, len(ids))
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if seen[id] || !s.idx.Has(id) {
			continue
		}
		seen[id] = true
		loc, _, _, err := s.fetch(ctx, id)
		var ce *CorruptError
		switch {
		case err == nil:
		case errors.As(err, &ce):
			bad = append(bad, blobRef{id, loc.Pack})
		case errors.Is(err, ErrNotFound):
		default:
			return nil, fmt.Errorf("scrub: %w", err)
		}
	}
	if len(bad) == 0 {
		return nil, nil
	}
	if err := s.setAside(bad); err != nil {
		return nil, fmt.Errorf("scrub: %w", err)
	}
	out := make([]ID, len(bad))
	for i, b := range bad {
		out[i] = b.Chunk
		s.log.Warn("damaged chunk set aside", "chunk", b.Chunk.String(), "pack", b.Pack.String())
	}
	return out, nil
}

// setAside records refs in the damaged file (durably, before anything
// else changes) and drops them from the index.
func (s *Store) setAside(refs []blobRef) error {
	s.gcLock.RLock()
	defer s.gcLock.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	have, err := s.readDamaged()
	if err != nil {
		return err
	}
	all := append(have, refs...)
	if err := s.writeDamaged(all); err != nil {
		return err
	}
	for _, r := range refs {
		s.idx.SetAside(r.Chunk, r.Pack)
	}
	return nil
}

// loadDamaged tells the index which blobs are set aside. A writer also
// forgets the ones whose packs a GC has deleted since.
func (s *Store) loadDamaged() error {
	refs, err := s.readDamaged()
	if err != nil || len(refs) == 0 {
		return err
	}
	var kept []blobRef
	for _, r := range refs {
		s.idx.SetAside(r.Chunk, r.Pack)
		if _, err := os.Stat(s.packPath(r.Pack)); err == nil {
			kept = append(kept, r)
		}
	}
	if s.opts.ReadOnly || len(kept) == len(refs) {
		return nil
	}
	return s.writeDamaged(kept)
}

func (s *Store) readDamaged() ([]blobRef, error) {
	b, err := os.ReadFile(s.path(damagedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var refs []blobRef
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		chunk, packID, ok := strings.Cut(sc.Text(), " ")
		c, err1 := ParseID(chunk)
		p, err2 := ParseID(packID)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: bad line %q", damagedFile, sc.Text())
		}
		refs = append(refs, blobRef{c, p})
	}
	return refs, sc.Err()
}

func (s *Store) writeDamaged(refs []blobRef) error {
	var b bytes.Buffer
	seen := map[blobRef]bool{}
	for _, r := range refs {
		if !seen[r] {
			seen[r] = true
			fmt.Fprintf(&b, "%s %s\n", r.Chunk, r.Pack)
		}
	}
	if b.Len() == 0 {
		err := os.Remove(s.path(damagedFile))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return syncDir(s.dir)
	}
	return writeFileAtomic(s.path(tmpDir), s.path(damagedFile), b.Bytes())
}
