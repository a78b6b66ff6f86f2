package store

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// TestIncompressible: random pages are stored raw without being tried,
// every one of a thousand; what zstd shrinks is still compressed, and
// chunks too short to sample are always tried.
func TestIncompressible(t *testing.T) {
	cd, err := newCodec(CompressionDefault)
	if err != nil {
		t.Fatal(err)
	}
	defer cd.close()
	rng := rand.New(rand.NewPCG(7, 9))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	for k := range 1000 {
		if p := random(4096); !incompressible(p) {
			t.Fatalf("random page %d was not taken for random", k)
		}
	}
	if !incompressible(random(1 << 20)) {
		t.Error("a random 1 MiB chunk was not taken for random")
	}
	if incompressible(random(minSampled - 1)) {
		t.Error("a chunk too short to sample was taken for random")
	}

	doubles := make([]byte, 4096)
	for i := range 512 {
		binary.LittleEndian.PutUint64(doubles[i*8:], math.Float64bits(float64(i)*0.5))
	}
	half := random(2048)
	for name, data := range map[string][]byte{
		"zeros":                 make([]byte, 4096),
		"text":                  bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog\n"), 100),
		"doubles":               doubles,
		"random with zero tail": append(random(2048), make([]byte, 2048)...),
		"a small alphabet":      bytes.Map(func(r rune) rune { return 'a' + r%16 }, random(4096)),
		"random, repeated once": append(half, half...),
	} {
		if name == "random, repeated once" {
			// The one kind the sample cannot see: long random runs
			// repeated within a chunk. Stored raw, as documented.
			if !incompressible(data) {
				t.Errorf("%s: taken for compressible; the documented trade changed", name)
			}
			continue
		}
		if incompressible(data) {
			t.Errorf("%s: taken for random", name)
		}
		blob, comp := cd.compress(data)
		if comp != pack.Zstd || len(blob) >= len(data) {
			t.Errorf("%s: stored as %v in %d bytes of %d", name, comp, len(blob), len(data))
		}
	}
}

func BenchmarkCompressRandomPage(b *testing.B) {
	cd, err := newCodec(CompressionDefault)
	if err != nil {
		b.Fatal(err)
	}
	defer cd.close()
	data := make([]byte, 4096)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		cd.compress(data)
	}
}
