package chunker

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
)

// Size limits.
const (
	// PageSize is the memory page size that fixed-size chunks must be a
	// multiple of.
	PageSize = 4096

	// MinSize, AvgSize and MaxSize are the default content-defined chunk
	// size limits (see DefaultParams and docs/format.md for the reasoning).
	MinSize = 64 << 10
	AvgSize = 256 << 10
	MaxSize = 1 << 20

	// MaxLimit is the largest Max that Params.Validate accepts.
	MaxLimit = 64 << 20

	// WindowSize is the number of trailing bytes that decide a
	// content-defined cut point.
	WindowSize = 64
)

// DefaultParams are the content-defined chunking parameters used for
// everything that is not a CRIU page image.
var DefaultParams = Params{Min: MinSize, Avg: AvgSize, Max: MaxSize}

// PageParams are the parameters for CRIU page images (pages-*.img): one
// chunk per 4 KiB page. docs/format.md explains why page images are not cut
// by content.
var PageParams = Fixed(PageSize)

// ErrInvalidParams is returned by Params.Validate for unusable parameters.
var ErrInvalidParams = errors.New("invalid chunker parameters")

// Params are the chunk size limits. With Min < Max the chunker is
// content-defined; with Min == Avg == Max it cuts fixed-size chunks (see
// Fixed).
type Params struct {
	// Min is the smallest chunk the chunker emits, except for the last
	// chunk of a stream, which may be shorter.
	Min int
	// Avg is the size at which normalized chunking switches from the hard
	// to the easy mask. It must be a power of two.
	Avg int
	// Max is the largest chunk the chunker emits.
	Max int
}

// Fixed returns Params that cut a stream into chunks of exactly size bytes
// (the last one may be shorter). Size must be a positive multiple of
// PageSize, so that chunks of a page image hold whole pages.
func Fixed(size int) Params { return Params{Min: size, Avg: size, Max: size} }

// IsFixed reports whether p selects fixed-size chunking.
func (p Params) IsFixed() bool { return p.Min == p.Max }

// Validate reports whether p can be used, with an error wrapping
// ErrInvalidParams if not.
func (p Params) Validate() error {
	if p.IsFixed() {
		if p.Avg != p.Max || p.Max <= 0 || p.Max%PageSize != 0 || p.Max > MaxLimit {
			return fmt.Errorf("%w: fixed size %d/%d/%d: need min = avg = max, a positive multiple of %d up to %d",
				ErrInvalidParams, p.Min, p.Avg, p.Max, PageSize, MaxLimit)
		}
		return nil
	}
	switch {
	case p.Min < WindowSize:
		return fmt.Errorf("%w: min %d below the %d byte window", ErrInvalidParams, p.Min, WindowSize)
	case p.Avg < 256 || p.Avg&(p.Avg-1) != 0:
		return fmt.Errorf("%w: avg %d is not a power of two >= 256", ErrInvalidParams, p.Avg)
	case !(p.Min <= p.Avg && p.Avg <= p.Max):
		return fmt.Errorf("%w: need min %d <= avg %d <= max %d", ErrInvalidParams, p.Min, p.Avg, p.Max)
	case p.Max > MaxLimit:
		return fmt.Errorf("%w: max %d above %d", ErrInvalidParams, p.Max, MaxLimit)
	}
	return nil
}

// Chunk is one chunk of the input stream.
type Chunk struct {
	// Start is the offset of the chunk's first byte in the stream.
	Start uint64
	// Length is the number of bytes in the chunk.
	Length int
	// Data holds the chunk's bytes. It is the buffer passed to Next if
	// that was large enough, and a new slice otherwise.
	Data []byte
}

// Chunker splits the bytes read from an io.Reader into chunks. It is not safe
// for concurrent use.
type Chunker struct {
	r     io.Reader
	p     Params
	maskS uint64 // before Avg: bits(Avg)+2 ones, harder to match
	maskL uint64 // from Avg on: bits(Avg)-2 ones, easier to match

	buf        []byte
	bpos, bmax int    // pending input is buf[bpos:bmax]
	pos        uint64 // stream offset of buf[bpos]
	eof        bool
	err        error
}

// New returns a Chunker that reads from r and cuts chunks according to p. It
// panics if p is invalid: check Params that do not come from constants with
// Params.Validate first.
func New(r io.Reader, p Params) *Chunker {
	if err := p.Validate(); err != nil {
		panic(err)
	}
	c := &Chunker{p: p}
	if !p.IsFixed() {
		b := bits.TrailingZeros(uint(p.Avg))
		c.maskS = ^uint64(0) << (64 - (b + 2))
		c.maskL = ^uint64(0) << (64 - (b - 2))
	}
	c.buf = make([]byte, max(4*p.Max, 256<<10))
	c.Reset(r)
	return c
}

// Reset makes c read a new stream from r, keeping its Params and buffer.
func (c *Chunker) Reset(r io.Reader) {
	c.r = r
	c.bpos, c.bmax = 0, 0
	c.pos = 0
	c.eof = false
	c.err = nil
}

// Next returns the next chunk of the stream. Its bytes are copied into buf if
// buf has the capacity, so a caller can reuse one buffer of size Max for all
// chunks. At the end of the stream Next returns io.EOF. An error from the
// reader is returned as is, and again by every later call.
func (c *Chunker) Next(buf []byte) (Chunk, error) {
	if err := c.fill(); err != nil {
		return Chunk{}, err
	}
	pending := c.buf[c.bpos:c.bmax]
	if len(pending) == 0 {
		return Chunk{}, io.EOF
	}
	n := c.cut(pending)
	ch := Chunk{Start: c.pos, Length: n, Data: append(buf[:0], pending[:n]...)}
	c.bpos += n
	c.pos += uint64(n)
	return ch, nil
}

// fill reads until at least Max bytes are pending or the stream ends.
func (c *Chunker) fill() error {
	if c.err != nil {
		return c.err
	}
	if c.eof || c.bmax-c.bpos >= c.p.Max {
		return nil
	}
	if len(c.buf)-c.bpos < c.p.Max {
		c.bmax = copy(c.buf, c.buf[c.bpos:c.bmax])
		c.bpos = 0
	}
	n, err := io.ReadAtLeast(c.r, c.buf[c.bmax:], c.p.Max-(c.bmax-c.bpos))
	c.bmax += n
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		c.eof = true
	case err != nil:
		c.err = fmt.Errorf("read chunker input at offset %d: %w", c.pos+uint64(c.bmax-c.bpos), err)
		return c.err
	}
	return nil
}

// cut returns the length of the chunk at the start of data, which holds at
// least Max bytes unless the stream ends within it.
func (c *Chunker) cut(data []byte) int {
	n := min(len(data), c.p.Max)
	if n <= c.p.Min {
		return n
	}
	// Prime the hash with the window before the first candidate cut, so
	// that every decision depends on exactly the 64 bytes before it.
	var h uint64
	for _, b := range data[c.p.Min-WindowSize : c.p.Min-1] {
		h = h<<1 + gear[b]
	}
	// A cut after length l is taken when the gear hash of data[l-64:l]
	// has zeros in all mask bits. The hard mask applies to l < Avg.
	l := c.p.Min
	for norm := min(c.p.Avg, n+1); l < norm; l++ {
		h = h<<1 + gear[data[l-1]]
		if h&c.maskS == 0 {
			return l
		}
	}
	for ; l <= n; l++ {
		h = h<<1 + gear[data[l-1]]
		if h&c.maskL == 0 {
			return l
		}
	}
	return n
}
