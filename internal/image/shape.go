package image

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/cairn-hpc/cairn/internal/store"
)

// The shape of an image: what its manifest may hold for restore to make
// it. Materialize, UnpackDelta and ingest check an image's fs delta node
// by node with checkFSNode as they make it; Import and Receive check a
// whole manifest with checkShape before anything of it is stored or
// listed. Both rest on checkFSNode, the one place that says which kinds
// of node a container's written files may hold.

// errNoCRIUFiles is returned by checkShape for an image without any of
// CRIU's files: there is nothing to restore.
var errNoCRIUFiles = errors.New("no CRIU image files")

// errCRIUFilesOnly is returned by checkShape for a files-only image that
// holds CRIU's files: its record and its manifest disagree.
var errCRIUFilesOnly = errors.New("CRIU files in a files-only image")

// checkFSNode checks one node of an fs delta, named relative to the
// container's root: a relative, clean path without "..", of a kind an
// overlay upper dir may hold and restore may make. Device nodes other
// than whiteouts are refused. Unix socket files are kept: restore makes
// them as socket files nobody listens on (what a server that has exited
// leaves), and CRIU unlinks such a file before it binds the socket of a
// restored listener at its path (docs/format.md §11).
func checkFSNode(name string, n store.Node) error {
	if c, err := cleanName(name); err != nil {
		return err
	} else if c != name {
		return fmt.Errorf("%w: path %q is not clean", ErrUnsafeEntry, name)
	}
	switch n.Kind {
	case store.KindDir, store.KindFile, store.KindSymlink, store.KindFIFO, store.KindSocket, store.KindWhiteout:
		return nil
	}
	return fmt.Errorf("%w: %q is a %s", ErrUnsafeEntry, name, kindName(n.Kind))
}

// checkShape checks that a manifest describes an image restore can make:
// a directory criu holding at least one of CRIU's files, all plain files
// directly in it (for a files-only image, as its record says: no criu
// directory at all); a directory fs (if any) holding nodes that pass
// checkFSNode, each inside a directory of the tree, so that no path goes
// through a symlink, file or missing parent; a plain file log (if any,
// the container's output); and nothing else. Errors about fs/ nodes wrap
// ErrUnsafeEntry.
func checkShape(m *store.Manifest, filesOnly bool) error {
	kinds := make(map[string]store.Kind, len(m.Nodes))
	criuFiles := 0
	for _, n := range m.Nodes {
		kinds[n.Path] = n.Kind
		switch {
		case filesOnly && (n.Path == CRIUDir || strings.HasPrefix(n.Path, CRIUDir+"/")):
			return fmt.Errorf("%w: %s", errCRIUFilesOnly, n.Path)
		case n.Path == CRIUDir || n.Path == FSDir:
			if n.Kind != store.KindDir {
				return fmt.Errorf("%s is a %s, not a directory", n.Path, kindName(n.Kind))
			}
		case strings.HasPrefix(n.Path, CRIUDir+"/"):
			if _, ok := kinds[CRIUDir]; !ok {
				return fmt.Errorf("%s: no directory %s", n.Path, CRIUDir)
			}
			if n.Kind != store.KindFile || strings.Contains(n.Path[len(CRIUDir)+1:], "/") {
				return fmt.Errorf("%s is not a plain CRIU image file", n.Path)
			}
			criuFiles++
		case strings.HasPrefix(n.Path, FSDir+"/"):
			name := n.Path[len(FSDir)+1:]
			if err := checkFSNode(name, n); err != nil {
				return err
			}
			// Nodes are sorted by path, so a parent comes before its
			// children.
			if parent := path.Dir(n.Path); kinds[parent] != store.KindDir {
				if _, ok := kinds[parent]; !ok {
					return fmt.Errorf("%w: %q: parent %q missing from the delta", ErrUnsafeEntry, name, parent)
				}
				return fmt.Errorf("%w: %q goes through non-directory %q", ErrUnsafeEntry, name, parent)
			}
		case isOutput(n.Path):
			if n.Kind != store.KindFile {
				return fmt.Errorf("%s is a %s, not a plain file", n.Path, kindName(n.Kind))
			}
		default:
			return fmt.Errorf("%s is outside %s/ and %s/ and not %s or %s", n.Path, CRIUDir, FSDir, LogName, LogTimesName)
		}
	}
	if criuFiles == 0 && !filesOnly {
		return errNoCRIUFiles
	}
	return nil
}

// shapeError is the error for an image of the wrong shape: corrupt, and
// wrapping what checkShape found (ErrUnsafeEntry for an fs/ node).
func shapeError(image string, err error) error {
	return &CorruptError{Image: image, What: "image", Reason: err.Error(), Err: err}
}
