package index_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/store/index"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// testPacks returns n packs of up to 20 entries laid out back to back, as
// a pack.Writer would.
func testPacks(seed uint64, n int) []index.PackEntries {
	rng := rand.New(rand.NewPCG(seed, 0))
	packs := make([]index.PackEntries, n)
	for i := range packs {
		packs[i].Pack = randID(rng)
		off := uint64(pack.HeaderOffset)
		for range rng.IntN(20) {
			e := pack.Entry{ID: randID(rng), Offset: off, RawLength: uint32(rng.IntN(1 << 20))}
			if rng.IntN(2) == 0 {
				e.Compression = pack.Zstd
				e.Length = uint32(1 + rng.IntN(1<<20))
			} else {
				e.Length = e.RawLength
			}
			off = e.End()
			packs[i].Entries = append(packs[i].Entries, e)
		}
	}
	return packs
}

func randID(rng *rand.Rand) (id [32]byte) {
	for i := range id {
		id[i] = byte(rng.Uint32())
	}
	return id
}

func TestEncodeDecode(t *testing.T) {
	for _, n := range []int{0, 1, 5, 50} {
		packs := testPacks(uint64(n), n)
		b := index.Encode(packs)
		got, err := index.Decode(b)
		if err != nil {
			t.Fatalf("%d packs: Decode: %v", n, err)
		}
		if diff := cmp.Diff(packs, got, cmp.Comparer(func(a, b []pack.Entry) bool {
			return len(a) == len(b) && (len(a) == 0 || cmp.Equal(a, b))
		})); diff != "" {
			t.Errorf("%d packs: (-encoded +decoded):\n%s", n, diff)
		}
	}
}

func TestEncodeIsCanonical(t *testing.T) {
	packs := testPacks(1, 10)
	want := index.Encode(packs)
	rng := rand.New(rand.NewPCG(2, 0))
	for range 5 {
		rng.Shuffle(len(packs), func(i, j int) { packs[i], packs[j] = packs[j], packs[i] })
		for _, p := range packs {
			rng.Shuffle(len(p.Entries), func(i, j int) { p.Entries[i], p.Entries[j] = p.Entries[j], p.Entries[i] })
		}
		if got := index.Encode(packs); !bytes.Equal(got, want) {
			t.Fatal("Encode depends on the order of its input")
		}
	}
}

// TestFileLayout pins the bytes of a small index file (docs/format.md).
func TestFileLayout(t *testing.T) {
	packs := []index.PackEntries{{
		Pack:    [32]byte{0xaa},
		Entries: []pack.Entry{{ID: [32]byte{0xbb}, Offset: 8, Length: 3, RawLength: 3}},
	}}
	got := index.Encode(packs)
	want := []byte(index.Magic)
	want = append(want, 1, 0, 0, 0)
	want = append(want, packs[0].Pack[:]...)
	want = append(want, 1, 0, 0, 0)
	want = pack.AppendEntry(want, packs[0].Entries[0])
	sum := blake3.Sum256(want)
	want = append(want, sum[:]...)
	if !bytes.Equal(got, want) {
		t.Errorf("Encode =\n%x\nwant\n%x", got, want)
	}
	if len(got) != 8+4+36+56+32 {
		t.Errorf("index file has %d bytes", len(got))
	}
}

// reseal replaces the checksum of an index file after a mutation, so that
// tests reach the checks behind it.
func reseal(b []byte) []byte {
	body := b[:len(b)-32]
	sum := blake3.Sum256(body)
	return append(bytes.Clone(body), sum[:]...)
}

func TestDecodeRejects(t *testing.T) {
	packs := testPacks(3, 3)
	for len(packs[0].Entries) < 2 || len(packs[1].Entries) < 1 {
		packs = testPacks(uint64(len(packs[0].Entries)+100), 3)
	}
	good := index.Encode(packs)
	first := 8 + 4 + 36 // offset of the first entry of the first pack
	tests := []struct {
		name   string
		mutate func([]byte) []byte
	}{
		{"empty", func(b []byte) []byte { return nil }},
		{"short", func(b []byte) []byte { return b[:40] }},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }},
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return reseal(b) }},
		{"bad version", func(b []byte) []byte { b[7] = 2; return reseal(b) }},
		{"bad checksum", func(b []byte) []byte { b[len(b)-1] ^= 1; return b }},
		{"flipped body bit", func(b []byte) []byte { b[20] ^= 4; return b }},
		{"too many packs", func(b []byte) []byte { b[8] = 0xff; b[9] = 0xff; return reseal(b) }},
		{"fewer packs", func(b []byte) []byte { b[8]--; return reseal(b) }},
		{"too many entries", func(b []byte) []byte { b[8+4+32] = 0xff; b[8+4+33] = 0xff; return reseal(b) }},
		{"packs out of order", func(b []byte) []byte {
			second := first + len(packs[0].Entries)*pack.EntrySize
			copy(b[second:second+32], b[12:44])
			return reseal(b)
		}},
		{"entries out of order", func(b []byte) []byte {
			e0 := bytes.Clone(b[first : first+pack.EntrySize])
			copy(b[first:], b[first+pack.EntrySize:first+2*pack.EntrySize])
			copy(b[first+pack.EntrySize:], e0)
			return reseal(b)
		}},
		{"overlapping entries", func(b []byte) []byte {
			// Move the second entry's offset one byte back.
			off := first + pack.EntrySize + 32
			binary.LittleEndian.PutUint64(b[off:], binary.LittleEndian.Uint64(b[off:])-1)
			return reseal(b)
		}},
		{"bad entry", func(b []byte) []byte { b[first+48] = 9; return reseal(b) }},
		{"trailing bytes", func(b []byte) []byte {
			return reseal(append(b[:len(b)-32:len(b)-32], make([]byte, 33)...))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := index.Decode(tc.mutate(bytes.Clone(good))); !errors.Is(err, index.ErrFormat) {
				t.Errorf("Decode = %v, want ErrFormat", err)
			}
		})
	}
}

func TestIndex(t *testing.T) {
	x := index.New()
	packs := testPacks(4, 5)
	for _, p := range packs {
		x.AddPack(p.Pack, p.Entries)
	}
	var n int
	for _, p := range packs {
		if !x.HasPack(p.Pack) {
			t.Errorf("HasPack(%x) = false", p.Pack)
		}
		for _, e := range p.Entries {
			n++
			loc, ok := x.Lookup(e.ID)
			if !ok || loc.Pack != p.Pack || loc.Entry != e {
				t.Errorf("Lookup(%x) = %+v, %v; want pack %x entry %+v", e.ID, loc, ok, p.Pack, e)
			}
			if !x.Has(e.ID) {
				t.Errorf("Has(%x) = false", e.ID)
			}
		}
	}
	if x.Len() != n {
		t.Errorf("Len() = %d, want %d", x.Len(), n)
	}
	if x.Has([32]byte{1, 2, 3}) || x.HasPack([32]byte{1, 2, 3}) {
		t.Error("index has an id that was never added")
	}
	if got := len(x.Packs()); got != len(packs) {
		t.Errorf("Packs() has %d packs, want %d", got, len(packs))
	}
	// Dump encodes to the same bytes as the packs it was built from.
	if !bytes.Equal(index.Encode(x.Dump()), index.Encode(packs)) {
		t.Error("Dump differs from the added packs")
	}

	// A chunk in a second pack keeps its first location.
	e := packs[0].Entries[0]
	dup := [32]byte{0xdd}
	x.AddPack(dup, []pack.Entry{{ID: e.ID, Offset: 8, Length: 1, RawLength: 1}})
	if loc, _ := x.Lookup(e.ID); loc.Pack != packs[0].Pack {
		t.Errorf("duplicate chunk moved to pack %x", loc.Pack)
	}
	if !x.HasPack(dup) || x.Len() != n {
		t.Errorf("after duplicate: HasPack = %v, Len = %d", x.HasPack(dup), x.Len())
	}
}

func TestReplaceTotals(t *testing.T) {
	x := index.New()
	old := testPacks(1, 3)
	for _, p := range old {
		x.AddPack(p.Pack, p.Entries)
	}
	packs := testPacks(2, 4)
	x.Replace(packs)
	var stored, raw uint64
	n := 0
	for _, p := range packs {
		if !x.HasPack(p.Pack) {
			t.Errorf("pack %x missing after Replace", p.Pack[:4])
		}
		for _, e := range p.Entries {
			n++
			stored += uint64(e.Length)
			raw += uint64(e.RawLength)
			if loc, ok := x.Lookup(e.ID); !ok || loc.Pack != p.Pack || loc.Entry != e {
				t.Errorf("Lookup(%x) = %+v, %v", e.ID[:4], loc, ok)
			}
		}
	}
	for _, p := range old {
		if x.HasPack(p.Pack) {
			t.Errorf("old pack %x still there after Replace", p.Pack[:4])
		}
	}
	if x.Len() != n {
		t.Errorf("Len = %d, want %d", x.Len(), n)
	}
	if s, r := x.Totals(); s != stored || r != raw {
		t.Errorf("Totals = %d, %d; want %d, %d", s, r, stored, raw)
	}
}
