package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/store"
)

// ErrUnsafeEntry is returned for a fs delta entry that could write outside
// the container root or create a device: an absolute path, a `..`
// component, a device node other than an overlay whiteout, a hard link to
// outside the delta.
var ErrUnsafeEntry = errors.New("unsafe fs delta entry")

const xattrPrefix = "SCHILY.xattr."

// typeSocket is the tar type of a unix socket file in an fs delta. tar has
// none ('A' to 'Z' are left to implementations; this one is cairn's): the
// entry is a header without data, with the socket file's mode, owner,
// times and xattrs.
const typeSocket = 'U'

// DeltaStats counts what a fs delta holds.
type DeltaStats struct {
	Files     int   `json:"files"`
	Dirs      int   `json:"dirs"`
	Whiteouts int   `json:"whiteouts"`
	Bytes     int64 `json:"bytes"` // regular file contents
}

func isWhiteout(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0
}

// PackDelta writes the tree under upper as a tar stream to w. Overlay
// whiteouts (character devices 0:0) are kept, and so are unix socket files
// (typeSocket); any other device node makes it fail with ErrUnsafeEntry
// rather than produce an image that restore would refuse.
func PackDelta(upper string, w io.Writer) (DeltaStats, error) {
	var st DeltaStats
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{} // (dev, ino) -> first name, for hard links
	buf := make([]byte, 1<<20)
	err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		if fi.Mode()&fs.ModeDevice != 0 && !isWhiteout(fi) {
			return fmt.Errorf("%w: %s is a device node", ErrUnsafeEntry, rel)
		}
		var hdr *tar.Header
		if fi.Mode()&fs.ModeSocket != 0 {
			hdr = socketHeader(fi)
		} else if hdr, err = tar.FileInfoHeader(fi, link); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Format = tar.FormatPAX
		hdr.Uname, hdr.Gname = "", ""
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			if fi.Mode().IsRegular() && sys.Nlink > 1 {
				key := [2]uint64{sys.Dev, sys.Ino}
				if first, seen := links[key]; seen {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				} else {
					links[key] = hdr.Name
				}
			}
		}
		if err := addXattrs(p, hdr); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		switch {
		case isWhiteout(fi):
			st.Whiteouts++
		case fi.IsDir():
			st.Dirs++
		default:
			st.Files++
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			n, err := io.CopyBuffer(tw, io.LimitReader(f, hdr.Size), buf)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			if n != hdr.Size {
				return fmt.Errorf("%s: changed size while captured", rel)
			}
			st.Bytes += n
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("pack fs delta %s: %w", upper, err)
	}
	return st, tw.Close()
}

// socketHeader is the tar header of a unix socket file, which
// tar.FileInfoHeader refuses.
func socketHeader(fi fs.FileInfo) *tar.Header {
	hdr := &tar.Header{Typeflag: typeSocket, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		hdr.Mode = int64(sys.Mode & 0o7777)
		hdr.Uid, hdr.Gid = int(sys.Uid), int(sys.Gid)
	}
	return hdr
}

func addXattrs(p string, hdr *tar.Header) error {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return nil // no xattrs, or not supported here
	}
	names := make([]byte, sz)
	sz, err = unix.Llistxattr(p, names)
	if err != nil {
		return err
	}
	for _, name := range strings.Split(strings.TrimRight(string(names[:sz]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		vsz, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			continue
		}
		val := make([]byte, vsz)
		if vsz, err = unix.Lgetxattr(p, name, val); err != nil {
			continue
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords[xattrPrefix+name] = string(val[:vsz])
	}
	return nil
}

// cleanName checks a tar entry name and returns it as a relative, clean,
// slash-separated path.
func cleanName(name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: absolute or empty path %q", ErrUnsafeEntry, name)
	}
	for _, part := range strings.Split(strings.TrimSuffix(name, "/"), "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: path %q leaves the root", ErrUnsafeEntry, name)
		}
	}
	c := path.Clean(name)
	if c == "." {
		return "", fmt.Errorf("%w: path %q names the root", ErrUnsafeEntry, name)
	}
	return c, nil
}

// checkHeader checks an fs delta tar entry: what only a tar can get
// wrong here, then the node it makes against checkFSNode, as every node of
// an image is checked.
func checkHeader(hdr *tar.Header) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	// A sparse entry can claim terabytes of zeros that the stream does not
	// hold; cairn never writes one.
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return fmt.Errorf("%w: %q is a sparse entry", ErrUnsafeEntry, hdr.Name)
		}
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeFifo, tar.TypeChar, tar.TypeBlock:
	case typeSocket:
		// tar readers take the size of an unknown type as data.
		if hdr.Size != 0 {
			return fmt.Errorf("%w: socket %q has %d bytes of data", ErrUnsafeEntry, hdr.Name, hdr.Size)
		}
	case tar.TypeLink:
		if _, err := cleanName(hdr.Linkname); err != nil {
			return fmt.Errorf("hard link %q: %w", hdr.Name, err)
		}
	default:
		return fmt.Errorf("%w: %q has unsupported type %q", ErrUnsafeEntry, hdr.Name, hdr.Typeflag)
	}
	if err := checkFSNode(name, nodeFromHeader(hdr, name)); err != nil {
		if hdr.Typeflag == tar.TypeChar {
			return fmt.Errorf("%w: %q is a character device %d:%d", ErrUnsafeEntry, hdr.Name, hdr.Devmajor, hdr.Devminor)
		}
		return err
	}
	return nil
}

// checkParents makes sure no existing parent of name inside dst is a
// symlink, so creating name cannot escape dst.
func checkParents(dst, name string) error {
	parts := strings.Split(name, "/")
	p := dst
	for _, part := range parts[:len(parts)-1] {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("%w: %q: parent %q missing from the delta", ErrUnsafeEntry, name, part)
		}
		if !fi.IsDir() {
			return fmt.Errorf("%w: %q goes through non-directory %q", ErrUnsafeEntry, name, part)
		}
	}
	return nil
}

func applyNodeMeta(p string, n store.Node) error {
	if err := os.Lchown(p, int(n.UID), int(n.GID)); err != nil {
		return err
	}
	for _, x := range n.Xattrs {
		if err := unix.Lsetxattr(p, x.Name, x.Value, 0); err != nil {
			return fmt.Errorf("set xattr %s: %w", x.Name, err)
		}
	}
	if n.Kind != store.KindSymlink {
		if err := os.Chmod(p, fs.FileMode(n.Mode&0o777)|modeBits(int64(n.Mode))); err != nil {
			return err
		}
	}
	mt := n.MTime
	if mt.IsZero() {
		mt = time.Now()
	}
	ts := []unix.Timespec{unix.NsecToTimespec(mt.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func mkfifo(p string, mode uint32) error { return unix.Mkfifo(p, mode&0o777) }

// mkSocket makes a unix socket file that no socket is bound to, as a
// server that has exited leaves it.
func mkSocket(p string, mode uint32) error { return unix.Mknod(p, unix.S_IFSOCK|(mode&0o777), 0) }

// mkWhiteout makes an overlay whiteout: a character device 0:0.
func mkWhiteout(p string, mode uint32) error { return unix.Mknod(p, unix.S_IFCHR|(mode&0o777), 0) }

func modeBits(m int64) fs.FileMode {
	var fm fs.FileMode
	if m&0o4000 != 0 {
		fm |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// nodeFromHeader is the manifest node of an fs delta entry (name cleaned),
// without its chunks. checkHeader decides whether it is allowed.
func nodeFromHeader(hdr *tar.Header, name string) store.Node {
	n := store.Node{
		Path: FSDir + "/" + name, Mode: uint32(hdr.Mode & 0o7777),
		UID: uint32(hdr.Uid), GID: uint32(hdr.Gid), MTime: hdr.ModTime,
	}
	for k, v := range hdr.PAXRecords {
		if x, ok := strings.CutPrefix(k, xattrPrefix); ok {
			n.Xattrs = append(n.Xattrs, store.Xattr{Name: x, Value: []byte(v)})
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		n.Kind = store.KindDir
	case tar.TypeReg, tar.TypeLink: // a hard link is kept as a copy
		n.Kind = store.KindFile
	case tar.TypeSymlink:
		n.Kind, n.Target = store.KindSymlink, hdr.Linkname
	case tar.TypeFifo:
		n.Kind = store.KindFIFO
	case typeSocket:
		n.Kind = store.KindSocket
	case tar.TypeChar: // an overlay whiteout is a character device 0:0
		n.Kind, n.Major, n.Minor = store.KindWhiteout, 0, 0
		if hdr.Devmajor != 0 || hdr.Devminor != 0 {
			n.Kind, n.Major, n.Minor = store.KindCharDev, uint32(hdr.Devmajor), uint32(hdr.Devminor)
		}
	case tar.TypeBlock:
		n.Kind, n.Major, n.Minor = store.KindBlockDev, uint32(hdr.Devmajor), uint32(hdr.Devminor)
	}
	return n
}
