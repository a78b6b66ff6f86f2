package container

import (
	"context"
	"errors"
	"io"
	"os"
	"time"

	"github.com/cairn-hpc/cairn/internal/human"
)

// LogOptions say which of a container's output CopyLog writes.
type LogOptions struct {
	// Incarnation is the incarnation whose output is written (0: the
	// current one).
	Incarnation int
	// Follow goes on writing what the container prints until it stops, a
	// restore replaces the incarnation, or ctx is done.
	Follow bool
	// Tail, if more than 0, writes only the last Tail lines of what is
	// there already (then, with Follow, everything that comes).
	Tail int
	// Timestamps puts each line's time in front of it (RFC 3339, UTC;
	// "-" for a line from before logs had times).
	Timestamps bool
	// Since, if not zero, leaves out the lines that came before it (and
	// those of unknown time).
	Since time.Time
}

// CopyLog writes the output of container name to w, as o says. A log not
// written yet is empty.
func (m *Manager) CopyLog(ctx context.Context, w io.Writer, name string, o LogOptions) error {
	n, follow := o.Incarnation, o.Follow
	path, err := m.IncarnationLog(name, n)
	if err != nil {
		return err
	}
	if follow && n != 0 {
		// Only the current incarnation's log grows.
		cur, err := m.IncarnationLog(name, 0)
		follow = err == nil && cur == path
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	// Lines go through the stamper (times, Since) when asked, then
	// through the tail; once the tail is written, straight out.
	out := w
	var tw *human.TailWriter
	if o.Tail > 0 {
		tw = &human.TailWriter{W: w, N: o.Tail}
		out = tw
	}
	copyNew := func() error { // what the log has now that was not copied
		_, err := io.Copy(out, f)
		return err
	}
	if o.Timestamps || !o.Since.IsZero() {
		marks, err := openMarks(path)
		if err != nil {
			return err
		}
		defer marks.Close()
		st := newStamper(out, o)
		copyNew = func() error {
			// The marks first: the shim writes them before the bytes
			// they mark.
			if err := marks.more(st); err != nil {
				return err
			}
			st.w = out
			_, err := io.Copy(st, f)
			return err
		}
	}
	if err := copyNew(); err != nil {
		return err
	}
	if tw != nil {
		if err := tw.Flush(); err != nil {
			return err
		}
		out = w
	}
	for follow {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
		if err := copyNew(); err != nil {
			return err
		}
		in, err := m.Get(ctx, name)
		if err != nil {
			return err
		}
		// Active includes exiting: the shim still writes out the last
		// output.
		if !in.Status.Active() || replaced(f, path) {
			return copyNew()
		}
	}
	return nil
}

// replaced reports whether path no longer names the open file f: a
// restore made a new incarnation, and f is an earlier one's log now.
func replaced(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && !os.SameFile(a, b)
}
