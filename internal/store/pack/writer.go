package pack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/zeebo/blake3"
)

// ErrFinished is returned by a Writer used after Finish.
var ErrFinished = errors.New("pack already finished")

// Writer writes one pack to an io.Writer in a single pass. It is not safe for
// concurrent use. After any error the Writer is unusable and the partial pack
// must be discarded.
type Writer struct {
	w        io.Writer
	size     uint64
	entries  []Entry
	err      error
	finished bool
}

// NewWriter returns a Writer that writes a pack to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w}
}

// Add appends a blob holding the chunk id. data is the blob as stored, the
// chunk itself for None or a zstd frame for Zstd; rawLength is the chunk's
// length. Add returns the blob's entry.
func (w *Writer) Add(id [32]byte, data []byte, rawLength int, c Compression) (Entry, error) {
	if err := w.start(); err != nil {
		return Entry{}, err
	}
	if len(data) > MaxBlobSize || rawLength < 0 || rawLength > MaxBlobSize {
		return Entry{}, fmt.Errorf("add chunk %x: length %d/%d above %d", id, len(data), rawLength, MaxBlobSize)
	}
	e := Entry{ID: id, Offset: w.size, Length: uint32(len(data)), RawLength: uint32(rawLength), Compression: c}
	if err := e.Validate(); err != nil {
		return Entry{}, fmt.Errorf("add chunk %x: %w", id, err)
	}
	if err := w.write(data); err != nil {
		return Entry{}, err
	}
	w.entries = append(w.entries, e)
	return e, nil
}

// Size returns the number of bytes written so far.
func (w *Writer) Size() uint64 { return w.size }

// Len returns the number of blobs added so far.
func (w *Writer) Len() int { return len(w.entries) }

// Finish writes the header and trailer and returns the pack's entries. It
// does not sync or close the underlying writer.
func (w *Writer) Finish() ([]Entry, error) {
	if err := w.start(); err != nil {
		return nil, err
	}
	hdr := make([]byte, 0, len(w.entries)*EntrySize+TrailerSize)
	for _, e := range w.entries {
		hdr = AppendEntry(hdr, e)
	}
	hdr = appendTrailer(hdr, hdr, len(w.entries))
	if err := w.write(hdr); err != nil {
		return nil, err
	}
	w.finished = true
	return w.entries, nil
}

// appendTrailer appends the trailer for header hdr with n entries to b.
func appendTrailer(b, hdr []byte, n int) []byte {
	sum := blake3.Sum256(hdr)
	b = append(b, sum[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = binary.LittleEndian.AppendUint32(b, 0) // reserved
	return append(b, Magic...)
}

// start checks the Writer is usable and writes the leading magic once.
func (w *Writer) start() error {
	switch {
	case w.err != nil:
		return w.err
	case w.finished:
		return ErrFinished
	case w.size == 0:
		return w.write([]byte(Magic))
	}
	return nil
}

func (w *Writer) write(b []byte) error {
	n, err := w.w.Write(b)
	w.size += uint64(n)
	if err != nil {
		w.err = fmt.Errorf("write pack: %w", err)
	}
	return w.err
}
