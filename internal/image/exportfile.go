package image

import (
	"context"
	"os"
	"path/filepath"
)

// ExportFile writes the export of one checkpoint (Export) to the file at
// path, whole or not at all: to a temporary file beside it, synced, then
// renamed, so that a failed export never leaves a file that looks
// complete.
func (r Repo) ExportFile(ctx context.Context, container string, seq int, path string, progress Progress) (*Record, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".cairn-export-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	rec, err := r.Export(ctx, container, seq, tmp, progress)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return rec, os.Rename(tmp.Name(), path)
}
