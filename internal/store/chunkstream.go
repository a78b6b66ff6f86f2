package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// Chunk stream constants; see docs/format.md, "Chunk stream".
const (
	// ChunkStreamMagic starts every chunk stream, followed by its
	// version byte.
	ChunkStreamMagic = "CAIRNCX"
	// MaxStreamChunks is the most chunks one chunk stream may carry.
	MaxStreamChunks = 1 << 16

	// damagedMark, as a chunk record's compression byte, says that the
	// sender's copy of that chunk is damaged and the stream ends there.
	damagedMark = 0xff
)

// Chunk stream versions. A receiver reads both; a sender writes the one
// asked for, so that agents of one API version but different releases
// still talk.
const (
	// ChunkStreamV1's trailing checksum covers every byte of the stream.
	ChunkStreamV1 = 1
	// ChunkStreamV2's covers the stream's header and its records'
	// headers, not the chunks' bytes: each chunk is verified against its
	// ID anyway, so a receiver (and a sender) hashes each byte once, not
	// twice.
	ChunkStreamV2 = 2
)

// ErrSenderDamaged is matched, besides ErrCorrupt, by the error of
// ImportChunks when the sender reported its own copy of a chunk damaged:
// the sender's store needs a repair, the receiver may fetch the chunk
// elsewhere.
var ErrSenderDamaged = errors.New("the sender's copy is damaged")

// ExportChunks writes the chunks ids, as stored, to w as one chunk stream
// (docs/format.md, "Chunk stream"): how a node fetching an image from
// several holders asks each for a share of its chunks. The chunks are not
// verified here: the receiver verifies every one against its ID and takes
// one that does not verify for damage in this store. A chunk the store
// lacks fails the export with an error matching ErrNotFound; one it cannot
// read is marked damaged in the stream and fails it with a CorruptError.
// What was written by then is not a valid stream. version is
// ChunkStreamV1 or ChunkStreamV2. ExportChunks holds a read session while
// it runs.
func (s *Store) ExportChunks(ctx context.Context, w io.Writer, ids []ID, version int) error {
	if len(ids) > MaxStreamChunks {
		return fmt.Errorf("export chunks: %d chunks is above the %d limit", len(ids), MaxStreamChunks)
	}
	if version != ChunkStreamV1 && version != ChunkStreamV2 {
		return fmt.Errorf("export chunks: no chunk stream version %d", version)
	}
	release, err := s.ReadSession(ctx)
	if err != nil {
		return fmt.Errorf("export chunks: %w", err)
	}
	defer release()
	out := newSummedWriter(w)
	out.headersOnly = version == ChunkStreamV2
	b := append([]byte(ChunkStreamMagic), byte(version), 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(b[len(ChunkStreamMagic)+1:], uint32(len(ids)))
	if _, err := out.Write(b); err != nil {
		return fmt.Errorf("export chunks: %w", err)
	}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("export chunks: %w", err)
		}
		loc, blob, err := s.fetchBlob(ctx, id)
		if errors.Is(err, ErrCorrupt) {
			// Say so, rather than cut the stream: the receiver tells a
			// damaged copy (to be repaired) from a lost connection.
			if werr := out.record(id, 0, 0, damagedMark, nil); werr == nil {
				_ = out.bw.Flush()
			}
		}
		if err != nil {
			return fmt.Errorf("export chunks: %w", err)
		}
		if err := out.record(id, loc.Length, loc.RawLength, loc.Compression, blob); err != nil {
			return fmt.Errorf("export chunks: %w", err)
		}
	}
	if err := out.finish(); err != nil {
		return fmt.Errorf("export chunks: %w", err)
	}
	return nil
}

// summedWriter buffers what is written to w and hashes it, for the
// trailing checksum of export files and chunk streams.
type summedWriter struct {
	io.Writer
	bw *bufio.Writer
	h  *blake3.Hasher
	// headersOnly leaves the chunks' blobs out of the checksum (chunk
	// stream version 2).
	headersOnly bool
}

func newSummedWriter(w io.Writer) *summedWriter {
	bw, h := bufio.NewWriterSize(w, 1<<20), blake3.New()
	return &summedWriter{Writer: io.MultiWriter(bw, h), bw: bw, h: h}
}

// finish writes the checksum of everything written and flushes.
func (s *summedWriter) finish() error {
	if _, err := s.bw.Write(s.h.Sum(nil)); err != nil {
		return err
	}
	return s.bw.Flush()
}

// ImportChunks reads a chunk stream from r that must hold exactly the
// chunks want, in that order, verifies each (decompressed and hashed)
// and stores those the store lacks as it goes. It returns the number of
// chunks it read and verified. A chunk that does not verify, a record out
// of order and a truncated or damaged stream fail with an error matching
// ErrCorrupt; the chunks read before it stay stored (each was verified),
// so that a caller may fetch only the rest elsewhere. The chunks are
// durable once a later Flush returns nil. ImportChunks may run
// concurrently with itself and Put on one store.
func (s *Store) ImportChunks(ctx context.Context, r io.Reader, want []ID) (int, error) {
	if s.opts.ReadOnly {
		return 0, fmt.Errorf("import chunks: %w", ErrReadOnly)
	}
	s.gcLock.RLock()
	defer s.gcLock.RUnlock()
	return s.readChunks(ctx, r, want, nil)
}

// ReadChunks reads a chunk stream from r as ImportChunks does, verifying
// every chunk, but hands each chunk's content to keep, in the order of
// want, instead of storing it: how a lazy restore takes pages from a
// holder, on a node that may have no store yet. An error from keep ends
// the read and is returned.
func ReadChunks(ctx context.Context, r io.Reader, want []ID, keep func(id ID, data []byte) error) (int, error) {
	cd, err := streamCodec()
	if err != nil {
		return 0, err
	}
	return (&Store{codec: cd}).readChunks(ctx, r, want, keep)
}

// streamCodec decodes the chunks ReadChunks reads; zstd's DecodeAll may
// run concurrently.
var streamCodec = sync.OnceValues(func() (*codec, error) { return newCodec(CompressionOff) })

func (s *Store) readChunks(ctx context.Context, r io.Reader, want []ID, keep func(ID, []byte) error) (int, error) {
	ir := &importReader{r: bufio.NewReaderSize(r, 1<<20), h: blake3.New()}
	magic := ir.read(len(ChunkStreamMagic)+1, len(ChunkStreamMagic)+1)
	if ir.err == nil {
		switch v := magic[len(ChunkStreamMagic)]; {
		case string(magic[:len(ChunkStreamMagic)]) != ChunkStreamMagic:
			ir.fail("chunk stream: magic %q", magic)
		case v == ChunkStreamV2:
			ir.headersOnly = true
		case v != ChunkStreamV1:
			ir.fail("chunk stream: version %d is not known here", v)
		}
	}
	if n := ir.u32(); ir.err == nil && int(n) != len(want) {
		ir.fail("chunk stream holds %d chunks, want %d", n, len(want))
	}
	done := 0
	for _, id := range want {
		if ir.err != nil {
			break
		}
		if err := ctx.Err(); err != nil {
			return done, fmt.Errorf("import chunks: %w", err)
		}
		if hdr, err := ir.r.Peek(exportChunkHeaderSize); err == nil && hdr[40] == damagedMark {
			ir.err = fmt.Errorf("%w: chunk stream: the sender's copy of chunk %x is damaged: %w", ErrCorrupt, hdr[:IDSize], ErrSenderDamaged)
			break
		}
		if err := s.importChunk(ir, func(got ID) {
			if got != id {
				ir.fail("chunk stream: chunk %s where %s was asked", got, id)
			}
		}, keep); err != nil {
			return done, fmt.Errorf("import chunks: %w", err)
		}
		if ir.err == nil {
			done++
		}
	}
	if ir.err == nil {
		got := make([]byte, IDSize)
		if _, err := io.ReadFull(ir.r, got); err != nil {
			ir.setErr(err)
		} else if !bytes.Equal(got, ir.h.Sum(nil)) {
			ir.fail("chunk stream: checksum mismatch")
		}
	}
	if ir.err != nil {
		return done, fmt.Errorf("import chunks: %w", ir.err)
	}
	return done, nil
}

// record writes one chunk record of an export file or chunk stream: the
// chunk's header and its blob as stored.
func (s *summedWriter) record(id ID, length, rawLength uint32, comp pack.Compression, blob []byte) error {
	var hdr [exportChunkHeaderSize]byte
	copy(hdr[:], id[:])
	binary.LittleEndian.PutUint32(hdr[32:], length)
	binary.LittleEndian.PutUint32(hdr[36:], rawLength)
	hdr[40] = byte(comp)
	if _, err := s.Write(hdr[:]); err != nil {
		return err
	}
	w := s.Writer
	if s.headersOnly {
		w = s.bw
	}
	_, err := w.Write(blob)
	return err
}
