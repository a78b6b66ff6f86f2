package pack_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// FuzzReadHeader feeds arbitrary bytes to ReadHeader as a whole pack. It
// must not panic, and what it accepts must be readable.
func FuzzReadHeader(f *testing.F) {
	p, _ := writePack(f, testBlobs())
	f.Add(p)
	empty, _ := writePack(f, nil)
	f.Add(empty)
	f.Add([]byte(pack.Magic))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkPack(t, data)
	})
}

// FuzzParseHeader builds a pack around arbitrary header bytes with a valid
// trailer, so that the fuzzer reaches the entry checks past the checksum.
func FuzzParseHeader(f *testing.F) {
	p, entries := writePack(f, testBlobs())
	hdrStart := entries[len(entries)-1].End()
	f.Add(p[hdrStart:len(p)-pack.TrailerSize], uint16(hdrStart-uint64(pack.HeaderOffset)))
	f.Add(make([]byte, pack.EntrySize), uint16(0))
	f.Fuzz(func(t *testing.T, hdr []byte, gap uint16) {
		q := append([]byte(pack.Magic), make([]byte, gap)...)
		q = append(q, hdr...)
		sum := blake3.Sum256(hdr)
		q = append(q, sum[:]...)
		q = binary.LittleEndian.AppendUint32(q, uint32(len(hdr)/pack.EntrySize))
		q = append(q, 0, 0, 0, 0)
		q = append(q, pack.Magic...)
		checkPack(t, q)
	})
}

func checkPack(t *testing.T, data []byte) {
	entries, err := pack.ReadHeader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.End() > uint64(len(data)) {
			t.Fatalf("accepted entry %+v beyond the %d byte pack", e, len(data))
		}
		if _, err := pack.Load(bytes.NewReader(data), e, nil); err != nil {
			t.Fatalf("accepted entry %+v cannot be loaded: %v", e, err)
		}
	}
}
