package store

import (
	"fmt"
	"math"

	"github.com/klauspost/compress/zstd"

	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// Compression selects how new chunks are compressed.
type Compression int

const (
	// CompressionDefault is zstd at its default level (about zstd -3).
	CompressionDefault Compression = iota
	// CompressionFastest is zstd at its fastest level, for tests and
	// for checkpoints on the critical path of a busy node.
	CompressionFastest
	// CompressionBetter trades speed for a smaller store.
	CompressionBetter
	// CompressionOff stores every chunk uncompressed.
	CompressionOff
)

// codec compresses chunks into blobs and back.
type codec struct {
	enc *zstd.Encoder // nil for CompressionOff
	dec *zstd.Decoder
}

func newCodec(c Compression) (*codec, error) {
	var level zstd.EncoderLevel
	switch c {
	case CompressionDefault:
		level = zstd.SpeedDefault
	case CompressionFastest:
		level = zstd.SpeedFastest
	case CompressionBetter:
		level = zstd.SpeedBetterCompression
	case CompressionOff:
	default:
		return nil, fmt.Errorf("unknown compression %d", c)
	}
	var cd codec
	var err error
	if c != CompressionOff {
		// The frame checksum is off: every chunk is verified against its
		// BLAKE3 id after decompression.
		cd.enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(level), zstd.WithEncoderCRC(false),
			zstd.WithEncoderConcurrency(0), zstd.WithLowerEncoderMem(true))
		if err != nil {
			return nil, fmt.Errorf("zstd encoder: %w", err)
		}
	}
	cd.dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderMaxMemory(pack.MaxBlobSize))
	if err != nil {
		return nil, fmt.Errorf("zstd decoder: %w", err)
	}
	return &cd, nil
}

// compress returns the blob for chunk data: a zstd frame if that is shorter
// than data, data itself otherwise. Data that looks random is not tried:
// zstd takes as long over it as over any chunk (about four times what
// hashing it takes) only to store it raw in the end (docs/format.md).
func (cd *codec) compress(data []byte) ([]byte, pack.Compression) {
	if cd.enc == nil || len(data) == 0 || incompressible(data) {
		return data, pack.None
	}
	out := cd.enc.EncodeAll(data, make([]byte, 0, len(data)))
	if len(out) >= len(data) {
		return data, pack.None
	}
	return out, pack.Zstd
}

// Sampling for incompressible: about maxSamples bytes of a chunk, every
// step-th, step odd so that the samples fall on every offset within the
// 8-byte words of a page (the exponents of an array of doubles repeat
// where their low bytes look random).
const (
	maxSamples = 1024
	minSampled = 512 // shorter chunks are always tried
)

// entropyFloor is the order-0 entropy, in bits per byte, above which a
// chunk is taken for random: Huffman coding alone would save at most 2.5 %
// of it. What a chunk with such bytes could still give is repetition of
// long random runs within it, which memory pages seldom hold.
const entropyFloor = 7.8

// clog2[c] is c·log2(c).
var clog2 = func() (t [maxSamples + 1]float32) {
	for c := 1; c <= maxSamples; c++ {
		t[c] = float32(float64(c) * math.Log2(float64(c)))
	}
	return t
}()

// incompressible reports whether data's bytes look uniformly random: the
// entropy of a sample of them, Miller-Madow corrected for the sample's
// size, above entropyFloor. It reads about a quarter of a page.
func incompressible(data []byte) bool {
	if len(data) < minSampled {
		return false
	}
	step := len(data)/maxSamples | 1
	var hist [256]uint16
	n := 0
	for i := 0; i < len(data) && n < maxSamples; i += step {
		hist[data[i]]++
		n++
	}
	var sum float32
	seen := 0
	for _, c := range hist {
		if c > 0 {
			sum += clog2[c]
			seen++
		}
	}
	h := math.Log2(float64(n)) - float64(sum)/float64(n) + float64(seen-1)/(2*float64(n)*math.Ln2)
	return h > entropyFloor
}

// decompress returns the chunk encoded by blob. It fails unless the result
// has exactly rawLength bytes.
func (cd *codec) decompress(blob []byte, rawLength uint32, c pack.Compression) ([]byte, error) {
	switch c {
	case pack.None:
		if len(blob) != int(rawLength) {
			return nil, fmt.Errorf("blob of %d bytes, want %d", len(blob), rawLength)
		}
		return blob, nil
	case pack.Zstd:
		// The capacity limits decoding to rawLength bytes (and one more,
		// to detect a longer frame).
		out, err := cd.dec.DecodeAll(blob, make([]byte, 0, int(rawLength)+1))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		if len(out) != int(rawLength) {
			return nil, fmt.Errorf("decompressed to %d bytes, want %d", len(out), rawLength)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown compression %v", c)
}

func (cd *codec) close() {
	if cd.enc != nil {
		_ = cd.enc.Close()
	}
	cd.dec.Close()
}
