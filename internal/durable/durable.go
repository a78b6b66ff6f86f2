// Package durable writes small files so that a crash leaves either the old
// file or the complete new one: write a new temporary file beside it,
// fsync it, rename it over the old one, fsync the directory.
package durable

import (
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile atomically replaces path with data. The temporary file is
// created exclusively with mode 0600 and only then given mode, so secrets
// (keys) are never readable by others, even briefly; concurrent writers
// never share a temporary file.
func WriteFile(path string, data []byte, mode fs.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory, making renames and removals in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
