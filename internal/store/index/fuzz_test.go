package index_test

import (
	"bytes"
	"testing"

	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/store/index"
)

// FuzzDecode checks that Decode never panics and accepts only canonical
// files: whatever it decodes encodes back to the same bytes. Each input is
// tried as is and with a valid checksum appended, to get past the checksum.
func FuzzDecode(f *testing.F) {
	f.Add(index.Encode(nil))
	f.Add(index.Encode(testPacks(1, 1)))
	f.Add(index.Encode(testPacks(2, 3)))
	f.Fuzz(func(t *testing.T, data []byte) {
		sum := blake3.Sum256(data)
		for _, b := range [][]byte{data, append(bytes.Clone(data), sum[:]...)} {
			packs, err := index.Decode(b)
			if err != nil {
				continue
			}
			if got := index.Encode(packs); !bytes.Equal(got, b) {
				t.Fatalf("Decode accepted a non-canonical file:\n%x\nre-encodes as\n%x", b, got)
			}
		}
	})
}
