package store

import (
	"context"
	"fmt"

	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// Blob is a chunk as a store keeps it: its ID, its bytes as stored
// (compressed or not, docs/format.md section 3) and how to turn them back
// into the chunk. It lets another store, or a durable tier holding packs
// of the same format, take a chunk without compressing it again.
type Blob struct {
	ID          ID
	Data        []byte
	RawLength   uint32
	Compression pack.Compression
}

// Entry returns the pack entry of b at offset off.
func (b Blob) Entry(off uint64) pack.Entry {
	return pack.Entry{ID: b.ID, Offset: off, Length: uint32(len(b.Data)), RawLength: b.RawLength, Compression: b.Compression}
}

// Blob reads chunk id as stored, verified against its ID on the way: the
// same checks as Get, without handing out the decompressed bytes. A chunk
// the store lacks gives an error matching ErrNotFound, a damaged one a
// *CorruptError.
func (s *Store) Blob(ctx context.Context, id ID) (Blob, error) {
	if err := ctx.Err(); err != nil {
		return Blob{}, err
	}
	e, blob, _, ok, err := s.getPending(id)
	if err != nil {
		return Blob{}, err
	}
	if ok {
		return Blob{ID: id, Data: blob, RawLength: e.RawLength, Compression: e.Compression}, nil
	}
	loc, blob, _, err := s.fetch(ctx, id)
	if err != nil {
		return Blob{}, err
	}
	return Blob{ID: id, Data: blob, RawLength: loc.RawLength, Compression: loc.Compression}, nil
}

// VerifyBlob checks that b is a valid blob whose content hashes to its ID,
// and returns that content. A blob that does not verify gives an error
// matching ErrCorrupt that names the chunk.
func VerifyBlob(b Blob) ([]byte, error) {
	cd, err := streamCodec()
	if err != nil {
		return nil, err
	}
	return cd.verify(b)
}

func (cd *codec) verify(b Blob) ([]byte, error) {
	if err := b.Entry(uint64(pack.HeaderOffset)).Validate(); err != nil {
		return nil, fmt.Errorf("%w: chunk %s: %w", ErrCorrupt, b.ID, err)
	}
	data, err := cd.decompress(b.Data, b.RawLength, b.Compression)
	if err != nil {
		return nil, fmt.Errorf("%w: chunk %s: %w", ErrCorrupt, b.ID, err)
	}
	if got := Hash(data); got != b.ID {
		return nil, fmt.Errorf("%w: chunk %s: content hashes to %s", ErrCorrupt, b.ID, got)
	}
	return data, nil
}

// PutBlob verifies b (decompressed and hashed) and stores it as it is
// unless the store has the chunk; it reports whether it wrote it. A blob
// that does not verify is refused with an error matching ErrCorrupt and nothing is
// stored. Durability is as for Put: a later Flush makes it durable.
func (s *Store) PutBlob(ctx context.Context, b Blob) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if s.opts.ReadOnly {
		return false, fmt.Errorf("put blob %s: %w", b.ID, ErrReadOnly)
	}
	if s.Has(b.ID) {
		return false, nil
	}
	if _, err := s.codec.verify(b); err != nil {
		return false, fmt.Errorf("put blob: %w", err)
	}
	s.gcLock.RLock()
	defer s.gcLock.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	stored, err := s.addBlobLocked(b.ID, b.Data, int(b.RawLength), b.Compression)
	if err != nil {
		return false, fmt.Errorf("put blob %s: %w", b.ID, err)
	}
	return stored, nil
}
