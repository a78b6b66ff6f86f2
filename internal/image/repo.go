package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/cairn-hpc/cairn/internal/store"
)

// Repo is where a node keeps its images: a catalog of records
// (Dir/<container>/<seq>.json) over a content-addressed store (StoreDir)
// that holds every image's files as chunks, each stored once however many
// images share it.
type Repo struct {
	Dir         string // catalog
	StoreDir    string // content-addressed store
	Compression store.Compression
	Logger      *slog.Logger
	// CheckConfig, if set, checks the container config of every record
	// imported or received (Record.Config), as hostile input: an error
	// refuses the stream as corrupt before any of it is stored. The
	// container layer's rules (container.CheckRecordedConfig).
	CheckConfig func(json.RawMessage) error
}

// Progress is called with the bytes done so far and the total (0 if
// unknown). It may be nil.
type Progress func(done, total int64)

// OpenWriter opens the store for writing, waiting while another cairn
// process writes to it.
func (r Repo) OpenWriter(ctx context.Context) (*store.Store, error) {
	for {
		st, err := store.Open(r.StoreDir, store.Options{Compression: r.Compression, Logger: r.Logger})
		if !errors.Is(err, store.ErrLocked) {
			return st, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the store lock: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// OpenReader opens the store read-only. A store that is not there, or
// not yet: its dir made by a writer that has not written its config (two
// images received at once into a node's first store), is ErrNotFound.
func (r Repo) OpenReader() (*store.Store, error) {
	if _, err := os.Stat(r.StoreDir); err != nil {
		return nil, fmt.Errorf("%w: no store at %s", ErrNotFound, r.StoreDir)
	}
	st, err := store.Open(r.StoreDir, store.Options{ReadOnly: true, Logger: r.Logger})
	if errors.Is(err, store.ErrNotMade) {
		return nil, fmt.Errorf("%w: no store at %s yet: %w", ErrNotFound, r.StoreDir, err)
	}
	return st, err
}

// startProgress calls p every 100 ms with the count until stop is called,
// and once more at the end.
func startProgress(p Progress, done *atomic.Int64, total int64) (stop func()) {
	if p == nil {
		return func() {}
	}
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				p(done.Load(), total)
				return
			case <-t.C:
				p(done.Load(), total)
			}
		}
	}()
	return func() { close(quit); <-finished }
}
