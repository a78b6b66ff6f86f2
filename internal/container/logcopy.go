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
}

// CopyLog writes the output of container name to w, as o says. A log not
// written yet is empty.
func (m *Manager) CopyLog(ctx context.Context, w io.Writer, name string, o LogOptions) error {
	n, follow := o.Incarnation, o.Follow
	path, err := m.IncarnationLog(name, n)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if o.Tail > 0 {
		tw := &human.TailWriter{W: w, N: o.Tail}
		if _, err := io.Copy(tw, f); err != nil {
			return err
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	} else if _, err := io.Copy(w, f); err != nil {
		return err
	}
	for follow {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
		if _, err := io.Copy(w, f); err != nil {
			return err
		}
		in, err := m.Get(ctx, name)
		if err != nil {
			return err
		}
		// "exiting": the shim is still writing out the last output.
		if in.Status != "running" && in.Status != "paused" && in.Status != "exiting" || replaced(f, path) {
			_, err := io.Copy(w, f)
			return err
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
