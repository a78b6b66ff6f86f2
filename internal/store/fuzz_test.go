package store_test

import (
	"bytes"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
)

// FuzzManifestUnmarshal checks that decoding arbitrary bytes never panics
// and that whatever decodes is canonical: it encodes back to the same bytes.
// Each input is tried as is and with a valid checksum appended, so that the
// fuzzer reaches the parser behind the checksum.
func FuzzManifestUnmarshal(f *testing.F) {
	for _, m := range []*store.Manifest{{}, testManifest([]byte("a"), []byte("bc"))} {
		b, err := m.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-32])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sum := store.Hash(data)
		for _, b := range [][]byte{data, append(bytes.Clone(data), sum[:]...)} {
			var m store.Manifest
			if err := m.UnmarshalBinary(b); err != nil {
				continue
			}
			again, err := m.MarshalBinary()
			if err != nil {
				t.Fatalf("decoded manifest does not encode: %v", err)
			}
			if !bytes.Equal(again, b) {
				t.Fatalf("non-canonical manifest accepted:\n%x\nre-encodes as\n%x", b, again)
			}
		}
	})
}

func FuzzParseID(f *testing.F) {
	f.Add(store.Hash(nil).String())
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := store.ParseID(s)
		if err == nil && id.String() != s {
			t.Fatalf("ParseID(%q) = %s", s, id)
		}
	})
}
