package tier

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
)

// FileBucket is a Bucket in a directory, typically on a shared file
// system (file:///lustre/...): an object is a file named by its key. It
// is opened as an os.Root, so no key, and no symlink another user plants
// in the directory, reaches outside it. Files are written 0600 under a
// temporary name, fsynced, and renamed into place, then their directory
// is fsynced: a reader sees a whole object or none.
type FileBucket struct {
	dir  string
	root *os.Root
}

// OpenFileBucket opens dir as a bucket, creating it (mode 0700) if absent.
func OpenFileBucket(dir string) (*FileBucket, error) {
	if !path.IsAbs(dir) {
		return nil, fmt.Errorf("file tier %q: the path must be absolute", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("file tier: %w", unreachable(err))
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("file tier: %w", unreachable(err))
	}
	return &FileBucket{dir: dir, root: r}, nil
}

// unreachable marks a failure to reach the tier's directory as such, or
// as a denial for a permission error.
func unreachable(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w: %w", ErrDenied, err)
	}
	return fmt.Errorf("%w: %w", ErrUnreachable, err)
}

func (b *FileBucket) String() string { return "file://" + b.dir }

// Close releases the directory.
func (b *FileBucket) Close() error { return b.root.Close() }

func (b *FileBucket) Put(ctx context.Context, key string, data []byte) (err error) {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir := path.Dir(key)
	if err := b.root.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := path.Join(dir, ".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := b.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			b.root.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := b.root.Rename(tmp, key); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	d, err := b.root.Open(dir)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// open opens object key for reading: a regular file, nothing else.
func (b *FileBucket) open(key string) (*os.File, int64, error) {
	if err := checkKey(key); err != nil {
		return nil, 0, err
	}
	f, err := b.root.Open(key)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("get %s: %w", key, ErrNotExist)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("get %s: %w", key, err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%w: not a regular file", ErrCorrupt)
	}
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("get %s: %w", key, err)
	}
	return f, fi.Size(), nil
}

func (b *FileBucket) Get(ctx context.Context, key string) ([]byte, error) {
	f, size, err := b.open(key)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, size)
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return buf, nil
}

func (b *FileBucket) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	f, size, err := b.open(key)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if off < 0 || n < 0 || off+n > size {
		return nil, fmt.Errorf("get %s: range %d+%d outside its %d bytes: %w", key, off, n, size, ErrShort)
	}
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return buf, nil
}

// List walks the directory under prefix's last slash, in key order;
// temporary files (names starting with a dot) and anything but regular
// files are not objects.
func (b *FileBucket) List(ctx context.Context, prefix string) ([]Object, error) {
	start := "."
	if i := strings.LastIndex(prefix, "/"); i > 0 {
		start = prefix[:i]
		if err := checkKey(start); err != nil {
			return nil, err
		}
	}
	var out []Object
	err := fs.WalkDir(b.root.FS(), start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") && p != start {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			// Only descend where keys under prefix may lie.
			if p != start && !strings.HasPrefix(p+"/", prefix) && !strings.HasPrefix(prefix, p+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(p, prefix) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, Object{Key: p, Size: fi.Size()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s%s: %w", b, prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (b *FileBucket) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := b.root.Remove(key); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}
