package container

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/cairn-hpc/cairn/internal/image"
)

// When a container's output came. Beside every log (container.log,
// incarnations/N.log, an image's image.LogName) the file of the same name
// plus image.TimesSuffix holds marks: 16 bytes each, the log's offset and
// the Unix time in nanoseconds, little-endian int64s, in the order the
// shim wrote them, at most one a millisecond. A line's time is that of
// the last mark at or before its first byte: when the shim read it from
// the pipe. A checkpoint keeps the marks of the output it keeps and a
// restore starts the new log's marks with them, as it does the log. Logs
// written before marks were have none; their lines have no time.

// markSize is the size of one mark.
const markSize = 16

// mark says that the log's bytes from off on came at ns.
type mark struct{ off, ns int64 }

// markEvery is the least time between two marks.
const markEvery = int64(time.Millisecond)

func (m mark) encode() []byte {
	b := make([]byte, markSize)
	binary.LittleEndian.PutUint64(b[:8], uint64(m.off))
	binary.LittleEndian.PutUint64(b[8:], uint64(m.ns))
	return b
}

// errBadMarks is returned for a times file that is no log's: a mark
// before offset 0, or one that goes back.
var errBadMarks = errors.New("log times out of order")

// readMarks reads the marks of r; a torn last mark (a shim killed as it
// wrote) is left out, and marks that go back are refused (errBadMarks).
func readMarks(r io.Reader) ([]mark, error) {
	var out []mark
	br := bufio.NewReader(r)
	var b [markSize]byte
	for {
		if _, err := io.ReadFull(br, b[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return out, nil
			}
			return nil, err
		}
		m := mark{int64(binary.LittleEndian.Uint64(b[:8])), int64(binary.LittleEndian.Uint64(b[8:]))}
		if m.off < 0 {
			return nil, fmt.Errorf("%w: mark %d at offset %d", errBadMarks, len(out), m.off)
		}
		if n := len(out); n > 0 && m.off < out[n-1].off {
			return nil, fmt.Errorf("%w: mark %d at offset %d after one at %d", errBadMarks, n, m.off, out[n-1].off)
		}
		out = append(out, m)
	}
}

// markFile reads a log's marks as they are written.
type markFile struct {
	f   *os.File // nil: the log has no times
	off int64    // of the next mark to read
}

// openMarks opens the marks of the log at path.
func openMarks(path string) (*markFile, error) {
	f, err := os.Open(image.TimesOf(path))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return &markFile{f: f}, nil
}

// more tells st the marks written since the last call: whole ones only,
// so that one being written is read whole next time.
func (mf *markFile) more(st *stamper) error {
	if mf.f == nil {
		return nil
	}
	fi, err := mf.f.Stat()
	if err != nil {
		return err
	}
	n := (fi.Size() - mf.off) / markSize * markSize
	if n <= 0 {
		return nil
	}
	b := make([]byte, n)
	if _, err := mf.f.ReadAt(b, mf.off); err != nil {
		return err
	}
	marks, err := readMarks(bytes.NewReader(b))
	if err != nil {
		return err
	}
	mf.off += n
	st.add(marks)
	return nil
}

func (mf *markFile) Close() error {
	if mf.f == nil {
		return nil
	}
	return mf.f.Close()
}

// loadMarks reads the marks of the log at path; none if it has no times.
func loadMarks(path string) ([]mark, error) {
	f, err := os.Open(image.TimesOf(path))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readMarks(f)
}

// keepMarks writes the marks of the log at src for its first cut bytes
// to dst; nothing if the log has none.
func keepMarks(src, dst string, cut int64) error {
	marks, err := loadMarks(src)
	if err != nil {
		return err
	}
	return writeMarks(dst, marks, cut)
}

// writeMarks writes the marks for a log's first cut bytes to dst; no file
// for no marks.
func writeMarks(dst string, marks []mark, cut int64) error {
	if marks == nil {
		return nil
	}
	var buf bytes.Buffer
	for _, m := range marks {
		if m.off >= cut {
			break
		}
		buf.Write(m.encode())
	}
	return os.WriteFile(dst, buf.Bytes(), 0o600)
}

// stamper writes the lines of a log to w as LogOptions ask: with their
// times in front (Timestamps), or only those from Since on. It is told
// the log's marks as they come (add); a line's time is that of the last
// mark at or before its first byte.
type stamper struct {
	w          io.Writer
	timestamps bool
	since      time.Time
	marks      []mark
	off        int64 // the log's offset of the next byte written
	lineStart  bool
	keep       bool // whether the current line is written
}

func newStamper(w io.Writer, o LogOptions) *stamper {
	return &stamper{w: w, timestamps: o.Timestamps, since: o.Since, lineStart: true}
}

func (s *stamper) add(marks []mark) { s.marks = append(s.marks, marks...) }

// at is the time of the log's byte at off (zero: none known).
func (s *stamper) at(off int64) time.Time {
	i := sort.Search(len(s.marks), func(i int) bool { return s.marks[i].off > off })
	if i == 0 {
		return time.Time{}
	}
	return time.Unix(0, s.marks[i-1].ns)
}

// noTime stands for the time of a line written before its log had times.
const noTime = "-"

func (s *stamper) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if s.lineStart {
			t := s.at(s.off)
			s.keep = s.since.IsZero() || !t.IsZero() && !t.Before(s.since)
			if s.keep && s.timestamps {
				stamp := noTime
				if !t.IsZero() {
					stamp = t.UTC().Format(time.RFC3339Nano)
				}
				if _, err := io.WriteString(s.w, stamp+" "); err != nil {
					return 0, err
				}
			}
			s.lineStart = false
		}
		line := p
		if i := bytes.IndexByte(p, '\n'); i >= 0 {
			line = p[:i+1]
			s.lineStart = true
		}
		if s.keep {
			if _, err := s.w.Write(line); err != nil {
				return 0, err
			}
		}
		s.off += int64(len(line))
		p = p[len(line):]
	}
	return n, nil
}
