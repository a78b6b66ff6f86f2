//go:build unix

package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockDir takes the writer's exclusive flock on dir/lock. Closing the
// returned file releases it; so does the death of the process.
func lockDir(dir string) (*os.File, error) {
	name := filepath.Join(dir, "lock")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", dir, ErrLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

// readersFile is the file on which read sessions hold a shared flock and
// GC an exclusive one while it deletes packs.
const readersFile = "readers"

// openReaders opens dir/readers, creating it if it is missing.
func openReaders(dir string) (*os.File, error) {
	name := filepath.Join(dir, readersFile)
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		// A store created before the readers lock existed, or a reader
		// racing the writer's first Open.
		f, err = os.OpenFile(name, os.O_RDONLY|os.O_CREATE, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("open readers lock: %w", err)
	}
	return f, nil
}

// flockWait takes a flock of kind how (LOCK_SH or LOCK_EX) on f, polling
// until it gets it or ctx is done. flock(2) itself cannot be interrupted
// by a context.
func flockWait(ctx context.Context, f *os.File, how int) error {
	delay := time.Millisecond
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("flock %s: %w", f.Name(), err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("wait for lock %s: %w", f.Name(), ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// lockReaders opens the readers lock file of dir and takes a flock of kind
// how on it. Closing the file releases the lock.
func lockReaders(ctx context.Context, dir string, how int) (*os.File, error) {
	f, err := openReaders(dir)
	if err != nil {
		return nil, err
	}
	if err := flockWait(ctx, f, how); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// Kinds of flock for lockReaders.
const (
	lockShared    = syscall.LOCK_SH
	lockExclusive = syscall.LOCK_EX
)
