package image

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cairn-hpc/cairn/internal/store"
)

// dirMeta is a directory made by makeEntry whose metadata is set last, once
// everything in it is made.
type dirMeta struct {
	p string
	n store.Node
}

// makeEntry creates one entry of an fs delta tree under dst (parents
// first), refusing unsafe names and kinds and any path through a symlink
// of the tree; content writes a regular file's bytes to a new file at its
// path. Directories get their metadata from finishDirs.
func makeEntry(dst, name string, n store.Node, content func(p string) error, dirs []dirMeta) ([]dirMeta, error) {
	if err := checkFSNode(name, n); err != nil {
		return dirs, err
	}
	if err := checkParents(dst, name); err != nil {
		return dirs, err
	}
	p := filepath.Join(dst, filepath.FromSlash(name))
	switch n.Kind {
	case store.KindDir:
		if err := os.Mkdir(p, 0o700); err != nil {
			return dirs, err
		}
		return append(dirs, dirMeta{p, n}), nil
	case store.KindFile:
		if content == nil {
			return dirs, fmt.Errorf("%s: a file without content", name)
		}
		if err := content(p); err != nil {
			return dirs, err
		}
	case store.KindSymlink:
		if err := os.Symlink(n.Target, p); err != nil {
			return dirs, err
		}
	case store.KindFIFO:
		if err := mkfifo(p, n.Mode); err != nil {
			return dirs, err
		}
	case store.KindSocket:
		if err := mkSocket(p, n.Mode); err != nil {
			return dirs, fmt.Errorf("make socket file %s: %w", name, err)
		}
	case store.KindWhiteout:
		if err := mkWhiteout(p, n.Mode); err != nil {
			return dirs, fmt.Errorf("make whiteout %s: %w", name, err)
		}
	default:
		return dirs, fmt.Errorf("%w: %q is a %s", ErrUnsafeEntry, name, kindName(n.Kind))
	}
	if err := applyNodeMeta(p, n); err != nil {
		return dirs, fmt.Errorf("%s: %w", name, err)
	}
	return dirs, nil
}

// finishDirs sets the metadata of the directories made, deepest first.
func finishDirs(dirs []dirMeta) error {
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := applyNodeMeta(dirs[i].p, dirs[i].n); err != nil {
			return err
		}
	}
	return nil
}

func kindName(k store.Kind) string {
	switch k {
	case store.KindCharDev:
		return "character device"
	case store.KindBlockDev:
		return "block device"
	case store.KindSocket:
		return "socket"
	}
	return fmt.Sprintf("file of kind %d", k)
}
