package image

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// UnpackDelta creates the tree of a captured fs delta (DeltaName in a
// staged image) in dst, as Materialize would from the store: the same
// checks (no device other than a whiteout, no path through a symlink of
// the tree, no "..") and the same modes, owners, xattrs and times. It is
// how a rank moved by a migration gets its files without a round trip
// through the store.
func UnpackDelta(ctx context.Context, tarPath, dst string) error {
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer f.Close()
	var dirs []dirMeta
	files := map[string]string{} // tar name -> path written, for hard links
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read fs delta: %w", err)
		}
		if err := checkHeader(hdr); err != nil {
			return err
		}
		name, _ := cleanName(hdr.Name)
		n := nodeFromHeader(hdr, name)
		var content func(p string) error
		switch hdr.Typeflag {
		case tar.TypeReg:
			content = func(p string) error { return copyTo(p, tr) }
			files[name] = filepath.Join(dst, filepath.FromSlash(name))
		case tar.TypeLink:
			target, _ := cleanName(hdr.Linkname)
			src, ok := files[target]
			if !ok {
				return fmt.Errorf("%w: hard link %q to %q, which is not a file in the delta", ErrUnsafeEntry, name, target)
			}
			content = func(p string) error {
				in, err := os.Open(src)
				if err != nil {
					return err
				}
				defer in.Close()
				return copyTo(p, in)
			}
		}
		if dirs, err = makeEntry(dst, name, n, content, dirs); err != nil {
			return err
		}
	}
	return finishDirs(dirs)
}

// copyTo writes r into a new file at p.
func copyTo(p string, r io.Reader) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
