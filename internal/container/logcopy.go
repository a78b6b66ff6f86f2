package container

import (
	"context"
	"errors"
	"io"
	"os"
	"time"
)

// CopyLog writes the output of incarnation n of container name (0: the
// current one) to w. With follow it goes on writing what the container
// prints until it stops, a restore replaces the incarnation, or ctx is
// done. A log not written yet is empty.
func (m *Manager) CopyLog(ctx context.Context, w io.Writer, name string, n int, follow bool) error {
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
	if _, err := io.Copy(w, f); err != nil {
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
