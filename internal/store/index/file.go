package index

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// Magic starts every index file: "CAIRNIX" and the format version 1.
const Magic = "CAIRNIX\x01"

const (
	packRecordSize = 32 + 4 // pack id and entry count
	checksumSize   = 32
)

// ErrFormat is returned, wrapped, by Decode for bytes that are not a valid
// index file.
var ErrFormat = errors.New("invalid index file")

// PackEntries are the entries of one pack as recorded in an index file.
type PackEntries struct {
	Pack    [32]byte
	Entries []pack.Entry
}

// Encode returns the index file holding packs. It sorts packs by id and each
// pack's entries by offset, in place, so that equal contents encode to equal
// bytes.
func Encode(packs []PackEntries) []byte {
	canonicalize(packs)
	n := len(Magic) + 4 + checksumSize
	for _, p := range packs {
		n += packRecordSize + len(p.Entries)*pack.EntrySize
	}
	b := make([]byte, 0, n)
	b = append(b, Magic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(packs)))
	for _, p := range packs {
		b = append(b, p.Pack[:]...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p.Entries)))
		for _, e := range p.Entries {
			b = pack.AppendEntry(b, e)
		}
	}
	sum := blake3.Sum256(b)
	return append(b, sum[:]...)
}

func canonicalize(packs []PackEntries) {
	slices.SortFunc(packs, func(a, b PackEntries) int { return cmpID(a.Pack, b.Pack) })
	for _, p := range packs {
		slices.SortFunc(p.Entries, cmpEntry)
	}
}

// cmpEntry orders entries by offset, then length (so that an empty blob
// comes before a non-empty one at the same offset), then id.
func cmpEntry(a, b pack.Entry) int {
	return cmp.Or(cmp.Compare(a.Offset, b.Offset), cmp.Compare(a.Length, b.Length), cmpID(a.ID, b.ID))
}

// Decode parses an index file. It accepts only what Encode produces: a valid
// checksum, packs in strictly increasing id order, and in each pack valid
// entries that do not overlap, ordered by offset, length and id.
func Decode(b []byte) ([]PackEntries, error) {
	if len(b) < len(Magic)+4+checksumSize {
		return nil, fmt.Errorf("%w: %d bytes is too short", ErrFormat, len(b))
	}
	if string(b[:len(Magic)]) != Magic {
		return nil, fmt.Errorf("%w: magic %q", ErrFormat, b[:len(Magic)])
	}
	body, sum := b[:len(b)-checksumSize], b[len(b)-checksumSize:]
	if got := blake3.Sum256(body); string(got[:]) != string(sum) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrFormat)
	}
	rest := body[len(Magic):]
	npacks := binary.LittleEndian.Uint32(rest)
	rest = rest[4:]
	if uint64(npacks) > uint64(len(rest)/packRecordSize) {
		return nil, fmt.Errorf("%w: %d packs do not fit in %d bytes", ErrFormat, npacks, len(rest))
	}
	packs := make([]PackEntries, 0, npacks)
	for i := range npacks {
		if len(rest) < packRecordSize {
			return nil, fmt.Errorf("%w: pack %d truncated", ErrFormat, i)
		}
		var p PackEntries
		copy(p.Pack[:], rest)
		n := binary.LittleEndian.Uint32(rest[32:])
		rest = rest[packRecordSize:]
		if i > 0 && cmpID(packs[i-1].Pack, p.Pack) >= 0 {
			return nil, fmt.Errorf("%w: pack %x out of order", ErrFormat, p.Pack)
		}
		if uint64(n) > uint64(len(rest)/pack.EntrySize) {
			return nil, fmt.Errorf("%w: pack %x: %d entries do not fit in %d bytes", ErrFormat, p.Pack, n, len(rest))
		}
		p.Entries = make([]pack.Entry, 0, n)
		var end uint64
		for range n {
			e, err := pack.ParseEntry(rest)
			if err != nil {
				return nil, fmt.Errorf("%w: pack %x: %w", ErrFormat, p.Pack, err)
			}
			if k := len(p.Entries); k > 0 && cmpEntry(p.Entries[k-1], e) >= 0 {
				return nil, fmt.Errorf("%w: pack %x: entry %x out of order", ErrFormat, p.Pack, e.ID)
			}
			if e.Offset < end {
				return nil, fmt.Errorf("%w: pack %x: entry %x at offset %d overlaps the previous one", ErrFormat, p.Pack, e.ID, e.Offset)
			}
			end = max(end, e.End())
			p.Entries = append(p.Entries, e)
			rest = rest[pack.EntrySize:]
		}
		packs = append(packs, p)
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrFormat, len(rest))
	}
	return packs, nil
}
