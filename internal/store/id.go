package store

import (
	"encoding/hex"
	"fmt"

	"github.com/zeebo/blake3"
)

// IDSize is the length of an ID in bytes.
const IDSize = 32

// ID names a chunk, pack, index file or manifest: the BLAKE3-256 hash of its
// bytes.
type ID [IDSize]byte

// Hash returns the ID of data.
func Hash(data []byte) ID { return blake3.Sum256(data) }

// ParseID parses the 64 lowercase hex digits of an ID.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 2*IDSize {
		return id, fmt.Errorf("parse id %q: length %d, want %d", s, len(s), 2*IDSize)
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return id, fmt.Errorf("parse id %q: not lowercase hex", s)
		}
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("parse id %q: %w", s, err)
	}
	return id, nil
}

// String returns the ID as 64 lowercase hex digits.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// Short returns the first 8 hex digits of the ID, for messages.
func (id ID) Short() string { return hex.EncodeToString(id[:4]) }

// IsNull reports whether id is the zero ID, which names nothing.
func (id ID) IsNull() bool { return id == ID{} }

// MarshalText implements encoding.TextMarshaler.
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *ID) UnmarshalText(b []byte) error {
	v, err := ParseID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}
