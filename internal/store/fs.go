package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Directory layout of a store; see docs/format.md.
const (
	configFile   = "config"
	packsDir     = "packs"
	indexDir     = "index"
	manifestsDir = "manifests"
	tmpDir       = "tmp"

	dirMode  = 0o700 // checkpoints hold process memory: keep them private
	fileMode = 0o600
)

// writeFileAtomic writes b to a new file in tmp, fsyncs it, renames it to
// dst and fsyncs dst's directory. A crash leaves either no dst or a complete
// one, plus possibly a temporary file that the next writer removes.
func writeFileAtomic(tmp, dst string, b []byte) (err error) {
	f, err := os.CreateTemp(tmp, "file-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(b); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), dst); err != nil {
		return err
	}
	return syncDir(filepath.Dir(dst))
}

// syncDir fsyncs a directory, making renames and removals in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// mkdir creates dir if needed and reports whether it did.
func mkdir(dir string) (bool, error) {
	err := os.Mkdir(dir, dirMode)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	return err == nil, err
}
