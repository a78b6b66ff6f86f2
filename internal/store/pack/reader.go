package pack

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/zeebo/blake3"
)

// ReadHeader reads the trailer and header of the pack of the given size from
// r, verifies them and returns the pack's entries in file order. Errors about
// the bytes read wrap ErrFormat; a pack whose writer did not finish has no
// valid trailer and fails here.
//
// Beyond the checksum, ReadHeader checks that the blobs lie back to back
// between the leading magic and the header, so every returned entry can be
// read from the pack.
func ReadHeader(r io.ReaderAt, size int64) ([]Entry, error) {
	if size < int64(HeaderOffset+TrailerSize) {
		return nil, fmt.Errorf("%w: %d bytes is too short for a pack", ErrFormat, size)
	}
	magic := make([]byte, HeaderOffset)
	if err := readAt(r, magic, 0); err != nil {
		return nil, fmt.Errorf("read pack magic: %w", err)
	}
	if string(magic) != Magic {
		return nil, fmt.Errorf("%w: leading magic %q", ErrFormat, magic)
	}
	trailer := make([]byte, TrailerSize)
	if err := readAt(r, trailer, size-TrailerSize); err != nil {
		return nil, fmt.Errorf("read pack trailer: %w", err)
	}
	sum, n, err := ParseTrailer(trailer)
	if err != nil {
		return nil, err
	}
	hdrLen := int64(n) * EntrySize
	if hdrLen > size-int64(HeaderOffset+TrailerSize) {
		return nil, fmt.Errorf("%w: %d entries do not fit a pack of %d bytes", ErrFormat, n, size)
	}
	hdrStart := size - TrailerSize - hdrLen
	hdr := make([]byte, hdrLen)
	if err := readAt(r, hdr, hdrStart); err != nil {
		return nil, fmt.Errorf("read pack header: %w", err)
	}
	if blake3.Sum256(hdr) != sum {
		return nil, fmt.Errorf("%w: header checksum mismatch", ErrFormat)
	}
	return ParseHeader(hdr, uint64(hdrStart))
}

// ParseTrailer decodes a trailer, returning the header checksum and entry
// count it records.
func ParseTrailer(b []byte) (sum [32]byte, n uint32, err error) {
	if len(b) != TrailerSize {
		return sum, 0, fmt.Errorf("%w: trailer of %d bytes, want %d", ErrFormat, len(b), TrailerSize)
	}
	if string(b[40:]) != Magic {
		return sum, 0, fmt.Errorf("%w: trailer magic %q", ErrFormat, b[40:])
	}
	if binary.LittleEndian.Uint32(b[36:]) != 0 {
		return sum, 0, fmt.Errorf("%w: trailer reserved bytes not zero", ErrFormat)
	}
	copy(sum[:], b[:32])
	return sum, binary.LittleEndian.Uint32(b[32:]), nil
}

// ParseHeader decodes the entries of a header that starts at offset hdrStart
// of its pack, checking that the blobs they describe lie back to back from
// HeaderOffset to hdrStart.
func ParseHeader(hdr []byte, hdrStart uint64) ([]Entry, error) {
	if len(hdr)%EntrySize != 0 {
		return nil, fmt.Errorf("%w: header of %d bytes is not a whole number of entries", ErrFormat, len(hdr))
	}
	entries := make([]Entry, 0, len(hdr)/EntrySize)
	next := uint64(HeaderOffset)
	for b := hdr; len(b) > 0; b = b[EntrySize:] {
		e, err := ParseEntry(b)
		if err != nil {
			return nil, err
		}
		if e.Offset != next {
			return nil, fmt.Errorf("%w: entry %x at offset %d, want %d", ErrFormat, e.ID, e.Offset, next)
		}
		next = e.End()
		entries = append(entries, e)
	}
	if next != hdrStart {
		return nil, fmt.Errorf("%w: blobs end at %d, header starts at %d", ErrFormat, next, hdrStart)
	}
	return entries, nil
}

// Load reads the blob described by e from the pack r into buf, growing it if
// needed, and returns it. It does not decompress or verify the blob.
func Load(r io.ReaderAt, e Entry, buf []byte) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	if cap(buf) < int(e.Length) {
		buf = make([]byte, e.Length)
	}
	buf = buf[:e.Length]
	if err := readAt(r, buf, int64(e.Offset)); err != nil {
		return nil, fmt.Errorf("read blob %x at offset %d: %w", e.ID, e.Offset, err)
	}
	return buf, nil
}

// readAt reads len(b) bytes at off, accepting io.EOF with a full read as
// io.ReaderAt allows.
func readAt(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}
