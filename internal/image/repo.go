package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/zeebo/blake3"
)

// Repo is a directory of images: Dir/<container>/<seq>/.
type Repo struct {
	Dir string
}

func (r Repo) containerDir(container string) string { return filepath.Join(r.Dir, container) }

// Path is the directory of one image.
func (r Repo) Path(container string, seq int) string {
	return filepath.Join(r.containerDir(container), strconv.Itoa(seq))
}

// List returns the manifests of a container's complete images, oldest
// first. Temporary (incomplete) directories are ignored; an image whose
// manifest does not parse is returned with only Container and Seq set and
// reported in the error slice.
func (r Repo) List(container string) ([]*Manifest, []error) {
	ents, err := os.ReadDir(r.containerDir(container))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, []error{err}
	}
	var ms []*Manifest
	var errs []error
	for _, e := range ents {
		seq, err := strconv.Atoi(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		m, err := r.Load(container, seq)
		if err != nil {
			errs = append(errs, err)
			m = &Manifest{Container: container, Seq: seq}
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Seq < ms[j].Seq })
	return ms, errs
}

// Containers lists the containers that have images.
func (r Repo) Containers() ([]string, error) {
	ents, err := os.ReadDir(r.Dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// Latest returns the newest image of a container.
func (r Repo) Latest(container string) (*Manifest, error) {
	ms, _ := r.List(container)
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].Version != 0 {
			return ms[i], nil
		}
	}
	return nil, fmt.Errorf("%w: container %s has no checkpoint", ErrNotFound, container)
}

// NextSeq returns the number the next image of container gets.
func (r Repo) NextSeq(container string) int {
	ents, _ := os.ReadDir(r.containerDir(container))
	next := 1
	for _, e := range ents {
		name := strings.TrimSuffix(e.Name(), ".tmp")
		if i := strings.IndexByte(name, '.'); i >= 0 {
			name = name[:i]
		}
		if n, err := strconv.Atoi(name); err == nil && n >= next {
			next = n + 1
		}
	}
	return next
}

// Load reads and checks an image's manifest.
func (r Repo) Load(container string, seq int) (*Manifest, error) {
	dir := r.Path(container, seq)
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		if os.IsNotExist(err) {
			if _, serr := os.Stat(dir); serr != nil {
				return nil, fmt.Errorf("%w: %s:%d", ErrNotFound, container, seq)
			}
			return nil, &CorruptError{Image: dir, Reason: "missing"}
		}
		return nil, err
	}
	return decodeManifest(dir, b)
}

func decodeManifest(dir string, b []byte) (*Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, &CorruptError{Image: dir, Reason: err.Error()}
	}
	if m.Version != FormatVersion {
		return nil, &CorruptError{Image: dir, Reason: fmt.Sprintf("format version %d, this cairn reads %d", m.Version, FormatVersion)}
	}
	seen := map[string]bool{}
	for _, f := range m.Files {
		if _, err := cleanName(f.Path); err != nil || f.Size < 0 || len(f.BLAKE3) != 64 || seen[f.Path] {
			return nil, &CorruptError{Image: dir, Reason: fmt.Sprintf("bad file entry %+v", f)}
		}
		seen[f.Path] = true
	}
	if !seen[DeltaName] {
		return nil, &CorruptError{Image: dir, Reason: "no fs delta listed"}
	}
	return &m, nil
}

// Remove deletes an image.
func (r Repo) Remove(container string, seq int) error {
	dir := r.Path(container, seq)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("%w: %s:%d", ErrNotFound, container, seq)
	}
	// Rename first so a half-deleted image is never listed.
	tmp := dir + ".rm.tmp"
	if err := os.Rename(dir, tmp); err != nil {
		return err
	}
	err := os.RemoveAll(tmp)
	_ = os.Remove(r.containerDir(container)) // only if empty
	return err
}

// CleanTemp removes leftovers of interrupted writes and removals.
func (r Repo) CleanTemp(container string) {
	ents, _ := os.ReadDir(r.containerDir(container))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			_ = os.RemoveAll(filepath.Join(r.containerDir(container), e.Name()))
		}
	}
}

// Write persists the staged image in src (a CRIU image directory CRIUDir and
// a DeltaName file) as the image m.Container:m.Seq: every file is copied,
// hashed and fsynced into a temporary directory, the manifest is written
// last, and the directory is renamed into place. On error nothing is
// listed. m.Files is filled in.
func (r Repo) Write(ctx context.Context, src string, m *Manifest) error {
	m.Version = FormatVersion
	final := r.Path(m.Container, m.Seq)
	tmp := final + ".tmp"
	if err := os.MkdirAll(r.containerDir(m.Container), 0o700); err != nil {
		return err
	}
	if _, err := os.Stat(final); err == nil {
		return fmt.Errorf("checkpoint %s already exists", m.Name())
	}
	_ = os.RemoveAll(tmp)
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(tmp)
		}
	}()
	m.Files = m.Files[:0]
	buf := make([]byte, 1<<20)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		dst := filepath.Join(tmp, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o700)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("staged image holds non-regular file %s", rel)
		}
		f, err := copyHashed(p, dst, buf)
		if err != nil {
			return err
		}
		f.Path = filepath.ToSlash(rel)
		m.Files = append(m.Files, f)
		return nil
	})
	if err != nil {
		return fmt.Errorf("write checkpoint %s: %w", m.Name(), err)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileSync(filepath.Join(tmp, ManifestName), b); err != nil {
		return err
	}
	if err := syncDirs(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	ok = true
	return syncDir(r.containerDir(m.Container))
}

func copyHashed(src, dst string, buf []byte) (File, error) {
	in, err := os.Open(src)
	if err != nil {
		return File{}, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return File{}, err
	}
	h := blake3.New()
	n, err := io.CopyBuffer(io.MultiWriter(out, h), in, buf)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return File{}, fmt.Errorf("copy %s: %w", src, err)
	}
	return File{Size: n, BLAKE3: hex.EncodeToString(h.Sum(nil))}, nil
}

func writeFileSync(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(p string) error {
	d, err := os.Open(p)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func syncDirs(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		return syncDir(p)
	})
}

// Materialize copies an image's files into dst (which must exist), checking
// each file's size and hash as it goes, so that what lands in dst is exactly
// what was checkpointed: CRIU then reads only verified bytes. A mismatch
// returns a *CorruptError naming the file. The manifest is returned.
func (r Repo) Materialize(ctx context.Context, container string, seq int, dst string) (*Manifest, error) {
	m, err := r.Load(container, seq)
	if err != nil {
		return nil, err
	}
	return m, r.verify(ctx, m, dst)
}

// Verify reads every file of an image and checks it against the manifest.
func (r Repo) Verify(ctx context.Context, container string, seq int) (*Manifest, error) {
	m, err := r.Load(container, seq)
	if err != nil {
		return nil, err
	}
	return m, r.verify(ctx, m, "")
}

func (r Repo) verify(ctx context.Context, m *Manifest, dst string) error {
	dir := r.Path(m.Container, m.Seq)
	buf := make([]byte, 1<<20)
	listed := map[string]bool{ManifestName: true}
	for _, f := range m.Files {
		listed[f.Path] = true
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := verifyFile(dir, f, dst, buf); err != nil {
			return err
		}
	}
	// Files the manifest does not list mean someone changed the image.
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if !listed[filepath.ToSlash(rel)] {
			return &CorruptError{Image: dir, File: rel, Reason: "not in the manifest"}
		}
		return nil
	})
}

func verifyFile(dir string, f File, dst string, buf []byte) error {
	corrupt := func(format string, a ...any) error {
		return &CorruptError{Image: dir, File: f.Path, Reason: fmt.Sprintf(format, a...)}
	}
	in, err := os.Open(filepath.Join(dir, filepath.FromSlash(f.Path)))
	if err != nil {
		if os.IsNotExist(err) {
			return corrupt("missing")
		}
		return err
	}
	defer in.Close()
	var w io.Writer = io.Discard
	if dst != "" {
		p := filepath.Join(dst, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		out, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		defer out.Close()
		w = out
	}
	h := blake3.New()
	// Read one byte past the recorded size to notice a grown file.
	n, err := io.CopyBuffer(io.MultiWriter(w, h), io.LimitReader(in, f.Size+1), buf)
	if err != nil {
		return fmt.Errorf("read %s: %w", f.Path, err)
	}
	switch {
	case n < f.Size:
		return corrupt("truncated: %d of %d bytes", n, f.Size)
	case n > f.Size:
		return corrupt("longer than the %d bytes recorded", f.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.BLAKE3 {
		return corrupt("BLAKE3 %s, manifest says %s", got[:16], f.BLAKE3[:16])
	}
	return nil
}

// IsCorrupt reports whether err says an image is corrupt.
func IsCorrupt(err error) bool { return errors.Is(err, ErrCorrupt) }

// ReadDeltaFile returns the contents of one regular file of an image's fs
// delta (path relative to the container root, slash-separated).
func (r Repo) ReadDeltaFile(container string, seq int, name string) ([]byte, error) {
	f, err := os.Open(filepath.Join(r.Path(container, seq), DeltaName))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReader(f))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("%s not in the fs delta of %s:%d: %w", name, container, seq, os.ErrNotExist)
		}
		if err != nil {
			return nil, err
		}
		if c, err := cleanName(hdr.Name); err == nil && c == name && hdr.Typeflag == tar.TypeReg {
			return io.ReadAll(tr)
		}
	}
}
