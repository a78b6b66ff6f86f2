package store

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound is returned, wrapped, for a chunk or manifest the store
	// does not have.
	ErrNotFound = errors.New("not found")

	// ErrCorrupt is matched by every *CorruptError: stored bytes that do
	// not hash to their ID, cannot be decompressed, or cannot be read.
	ErrCorrupt = errors.New("corrupt")

	// ErrLocked is returned by Open when another writer holds the store.
	ErrLocked = errors.New("store locked by another writer")

	// ErrReadOnly is returned by writes to a store opened read-only.
	ErrReadOnly = errors.New("store opened read-only")

	// ErrClosed is returned by a Store used after Close.
	ErrClosed = errors.New("store closed")

	// ErrNotMade is returned, wrapped, by a read-only Open of a store
	// whose config has not been written: none was made there, or its
	// first writer is making it.
	ErrNotMade = errors.New("no store made here yet")

	// ErrInvalidManifest is returned, wrapped, for a manifest that cannot
	// be encoded or stored: a bad path, a field that does not fit its kind,
	// a size that does not match its chunks.
	ErrInvalidManifest = errors.New("invalid manifest")
)

// CorruptError reports stored data that could not be read back intact. It
// matches ErrCorrupt with errors.Is.
type CorruptError struct {
	// ID names the chunk or manifest that was requested.
	ID ID
	// Pack is the pack holding the chunk; it is null for a manifest.
	Pack ID
	// Offset is the offset of the chunk's blob in Pack.
	Offset uint64
	// Err says what was wrong.
	Err error
}

func (e *CorruptError) Error() string {
	if e.Pack.IsNull() {
		return fmt.Sprintf("manifest %s corrupt: %v", e.ID, e.Err)
	}
	return fmt.Sprintf("chunk %s in pack %s at offset %d corrupt: %v", e.ID, e.Pack, e.Offset, e.Err)
}

// Is reports whether target is ErrCorrupt.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// Unwrap returns the underlying error.
func (e *CorruptError) Unwrap() error { return e.Err }
