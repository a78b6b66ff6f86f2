package pack

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Format constants; see docs/format.md.
const (
	// Magic starts and ends every pack: "CAIRNPK" and the format version 1.
	Magic = "CAIRNPK\x01"
	// HeaderOffset is the offset of the first blob, after the leading magic.
	HeaderOffset = len(Magic)
	// EntrySize is the encoded size of one Entry.
	EntrySize = 56
	// TrailerSize is the size of the trailer that ends every pack.
	TrailerSize = 48
	// MaxBlobSize is the largest raw or stored length of a blob.
	MaxBlobSize = 64 << 20
)

// ErrFormat is returned, wrapped, for bytes that are not a valid pack, header
// or entry.
var ErrFormat = errors.New("invalid pack format")

// Compression names how a blob's bytes encode its chunk.
type Compression uint8

const (
	// None: the blob is the chunk.
	None Compression = 0
	// Zstd: the blob is a single zstd frame that decodes to the chunk.
	Zstd Compression = 1
)

func (c Compression) String() string {
	switch c {
	case None:
		return "none"
	case Zstd:
		return "zstd"
	}
	return fmt.Sprintf("compression(%d)", uint8(c))
}

// Entry describes one blob of a pack.
type Entry struct {
	// ID is the BLAKE3-256 hash of the chunk (the raw bytes).
	ID [32]byte
	// Offset is the offset of the blob's first byte in the pack file.
	Offset uint64
	// Length is the number of bytes the blob occupies in the pack.
	Length uint32
	// RawLength is the length of the chunk after decompression.
	RawLength uint32
	// Compression is how the blob encodes the chunk.
	Compression Compression
}

// End returns the offset just after the blob.
func (e Entry) End() uint64 { return e.Offset + uint64(e.Length) }

// Validate checks the fields of e that do not depend on its pack.
func (e Entry) Validate() error {
	switch {
	case e.Compression != None && e.Compression != Zstd:
		return fmt.Errorf("%w: entry %x: unknown compression %d", ErrFormat, e.ID, uint8(e.Compression))
	case e.RawLength > MaxBlobSize || e.Length > MaxBlobSize:
		return fmt.Errorf("%w: entry %x: length %d/%d above %d", ErrFormat, e.ID, e.Length, e.RawLength, MaxBlobSize)
	case e.Compression == None && e.Length != e.RawLength:
		return fmt.Errorf("%w: entry %x: uncompressed with length %d != raw length %d", ErrFormat, e.ID, e.Length, e.RawLength)
	case e.Compression == Zstd && e.Length == 0:
		return fmt.Errorf("%w: entry %x: empty zstd blob", ErrFormat, e.ID)
	case e.Offset < uint64(HeaderOffset):
		return fmt.Errorf("%w: entry %x: offset %d inside the leading magic", ErrFormat, e.ID, e.Offset)
	}
	return nil
}

// AppendEntry appends the EntrySize bytes encoding e to b. The layout is
// shared by pack headers and index files.
func AppendEntry(b []byte, e Entry) []byte {
	b = append(b, e.ID[:]...)
	b = binary.LittleEndian.AppendUint64(b, e.Offset)
	b = binary.LittleEndian.AppendUint32(b, e.Length)
	b = binary.LittleEndian.AppendUint32(b, e.RawLength)
	b = append(b, byte(e.Compression))
	return append(b, 0, 0, 0, 0, 0, 0, 0) // reserved
}

// ParseEntry decodes and validates the entry in the first EntrySize bytes
// of b.
func ParseEntry(b []byte) (Entry, error) {
	if len(b) < EntrySize {
		return Entry{}, fmt.Errorf("%w: entry of %d bytes, want %d", ErrFormat, len(b), EntrySize)
	}
	var e Entry
	copy(e.ID[:], b[:32])
	e.Offset = binary.LittleEndian.Uint64(b[32:])
	e.Length = binary.LittleEndian.Uint32(b[40:])
	e.RawLength = binary.LittleEndian.Uint32(b[44:])
	e.Compression = Compression(b[48])
	for _, r := range b[49:EntrySize] {
		if r != 0 {
			return Entry{}, fmt.Errorf("%w: entry %x: reserved bytes not zero", ErrFormat, e.ID)
		}
	}
	return e, e.Validate()
}
