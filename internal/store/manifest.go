package store

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
)

// Kind is the type of a file in a manifest.
type Kind uint8

// Kinds of files. The values are part of the manifest format.
const (
	KindFile     Kind = 1 // regular file: Size and Chunks
	KindDir      Kind = 2
	KindSymlink  Kind = 3 // Target
	KindCharDev  Kind = 4 // Major, Minor; never 0:0, which is KindWhiteout
	KindBlockDev Kind = 5 // Major, Minor
	KindFIFO     Kind = 6
	KindSocket   Kind = 7
	// KindWhiteout is an overlayfs whiteout: in the upper directory, a
	// character device 0:0 that hides the lower file of the same path.
	// (An opaque directory is a KindDir with the xattr
	// trusted.overlay.opaque set to "y".)
	KindWhiteout Kind = 8
)

var kindNames = [...]string{
	KindFile: "file", KindDir: "dir", KindSymlink: "symlink", KindCharDev: "chardev",
	KindBlockDev: "blockdev", KindFIFO: "fifo", KindSocket: "socket", KindWhiteout: "whiteout",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Limits on manifest fields, from Linux's: PATH_MAX, XATTR_NAME_MAX and
// XATTR_SIZE_MAX.
const (
	MaxPathLen       = 4096
	MaxXattrNameLen  = 255
	MaxXattrValueLen = 64 << 10
	MaxLabelLen      = 4096
)

// Manifest describes a tree of files: one rank's CRIU image directory, or
// the upper directory of its overlay root. Regular files are lists of chunk
// IDs. A manifest is identified by the ID of its encoding (MarshalBinary),
// which is canonical: equal trees give equal bytes.
type Manifest struct {
	// Labels are free-form metadata, such as the CRIU version or the
	// image's rank.
	Labels map[string]string
	// Nodes are the files of the tree. MarshalBinary orders them by path;
	// UnmarshalBinary returns them in that order.
	Nodes []Node
}

// Node is one file of a manifest.
type Node struct {
	// Path is slash-separated, relative to the root of the tree, and
	// clean; "." is the root itself. No element is "..".
	Path string
	Kind Kind
	// Mode holds the permission bits and the setuid, setgid and sticky
	// bits (st_mode & 07777).
	Mode     uint32
	UID, GID uint32
	// MTime is the modification time, to the nanosecond.
	MTime time.Time
	// Size is the length of a regular file: the sum of its chunks'
	// lengths. It is zero for other kinds.
	Size uint64
	// Chunks are a regular file's contents, in order.
	Chunks []ID
	// Target is a symlink's target.
	Target string
	// Major and Minor are a device's numbers.
	Major, Minor uint32
	// Xattrs are the extended attributes, ordered by name by
	// MarshalBinary.
	Xattrs []Xattr
}

// Xattr is an extended attribute.
type Xattr struct {
	Name  string
	Value []byte
}

// validate checks a node on its own; canonical order is checked by the
// encoder and decoder.
func (n *Node) validate() error {
	if err := validPath(n.Path); err != nil {
		return err
	}
	if n.Mode&^0o7777 != 0 {
		return fmt.Errorf("mode %#o has bits beyond 07777", n.Mode)
	}
	if ns := n.MTime.Nanosecond(); ns < 0 || ns >= 1e9 {
		return fmt.Errorf("mtime nanoseconds %d", ns)
	}
	isDev := n.Kind == KindCharDev || n.Kind == KindBlockDev
	switch {
	case n.Kind < KindFile || n.Kind > KindWhiteout:
		return fmt.Errorf("unknown kind %d", uint8(n.Kind))
	case n.Kind != KindFile && (n.Size != 0 || len(n.Chunks) != 0):
		return fmt.Errorf("%s with size or chunks", n.Kind)
	case (n.Kind == KindSymlink) != (n.Target != ""):
		return fmt.Errorf("%s with target %q", n.Kind, n.Target)
	case !isDev && (n.Major != 0 || n.Minor != 0):
		return fmt.Errorf("%s with device numbers", n.Kind)
	case n.Kind == KindCharDev && n.Major == 0 && n.Minor == 0:
		return fmt.Errorf("character device 0:0: record it as %s", KindWhiteout)
	case len(n.Target) > MaxPathLen || strings.IndexByte(n.Target, 0) >= 0:
		return fmt.Errorf("invalid symlink target")
	}
	for _, x := range n.Xattrs {
		if x.Name == "" || len(x.Name) > MaxXattrNameLen || strings.IndexByte(x.Name, 0) >= 0 {
			return fmt.Errorf("invalid xattr name %q", x.Name)
		}
		if len(x.Value) > MaxXattrValueLen {
			return fmt.Errorf("xattr %s: value of %d bytes", x.Name, len(x.Value))
		}
	}
	return nil
}

func validPath(p string) error {
	switch {
	case p == "" || len(p) > MaxPathLen:
		return fmt.Errorf("path of %d bytes", len(p))
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("path %q contains NUL", p)
	case path.IsAbs(p) || path.Clean(p) != p:
		return fmt.Errorf("path %q is not clean and relative", p)
	case p == ".." || strings.HasPrefix(p, "../"):
		return fmt.Errorf("path %q leaves the tree", p)
	}
	return nil
}

// sortedNodes returns m's nodes, and their xattrs, in canonical order, in new
// slices, and checks them.
func (m *Manifest) sortedNodes() ([]Node, error) {
	nodes := slices.Clone(m.Nodes)
	slices.SortFunc(nodes, func(a, b Node) int { return strings.Compare(a.Path, b.Path) })
	for i := range nodes {
		n := &nodes[i]
		if i > 0 && nodes[i-1].Path == n.Path {
			return nil, fmt.Errorf("%w: duplicate path %q", ErrInvalidManifest, n.Path)
		}
		n.Xattrs = slices.Clone(n.Xattrs)
		slices.SortFunc(n.Xattrs, func(a, b Xattr) int { return cmp.Compare(a.Name, b.Name) })
		for j := 1; j < len(n.Xattrs); j++ {
			if n.Xattrs[j-1].Name == n.Xattrs[j].Name {
				return nil, fmt.Errorf("%w: %s: duplicate xattr %q", ErrInvalidManifest, n.Path, n.Xattrs[j].Name)
			}
		}
		if err := n.validate(); err != nil {
			return nil, fmt.Errorf("%w: %q: %w", ErrInvalidManifest, n.Path, err)
		}
	}
	return nodes, nil
}

// ChunkIDs returns the distinct chunk IDs the manifest references, in order
// of first use.
func (m *Manifest) ChunkIDs() []ID {
	seen := make(map[ID]bool)
	var ids []ID
	for _, n := range m.Nodes {
		for _, id := range n.Chunks {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	return ids
}
