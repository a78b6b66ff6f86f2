package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairn/internal/image"
)

// TestDeltaRoundTrip packs an upper dir with every kind of entry an overlay
// upper dir holds and unpacks it elsewhere.
func TestDeltaRoundTrip(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (whiteouts, chown)")
	}
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a/b"), 0o750))
	must(os.WriteFile(filepath.Join(src, "a/b/file"), []byte("hello"), 0o604))
	must(os.Chown(filepath.Join(src, "a/b/file"), 42, 43))
	must(os.Link(filepath.Join(src, "a/b/file"), filepath.Join(src, "a/hard")))
	must(os.Symlink("../outside/target", filepath.Join(src, "a/sym")))
	must(syscall.Mknod(filepath.Join(src, "a/whiteout"), syscall.S_IFCHR, 0))
	must(unix.Mkfifo(filepath.Join(src, "fifo"), 0o600))
	must(unix.Setxattr(filepath.Join(src, "a"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(filepath.Join(src, "empty"), nil, 0o755))
	must(os.Chmod(filepath.Join(src, "empty"), 0o755|os.ModeSetuid))

	var buf bytes.Buffer
	st, err := image.PackDelta(src, &buf)
	must(err)
	if st.Whiteouts != 1 || st.Dirs != 2 || st.Bytes != 5 {
		t.Errorf("stats %+v", st)
	}
	must(image.CheckDelta(bytes.NewReader(buf.Bytes())))
	dst := t.TempDir()
	must(image.UnpackDelta(bytes.NewReader(buf.Bytes()), dst))

	if b, err := os.ReadFile(filepath.Join(dst, "a/b/file")); err != nil || string(b) != "hello" {
		t.Errorf("file: %q %v", b, err)
	}
	var s1, s2 unix.Stat_t
	must(unix.Stat(filepath.Join(dst, "a/b/file"), &s1))
	must(unix.Stat(filepath.Join(dst, "a/hard"), &s2))
	if s1.Ino != s2.Ino || s1.Uid != 42 || s1.Gid != 43 || s1.Mode&0o7777 != 0o604 {
		t.Errorf("file meta: ino %d/%d uid %d gid %d mode %o", s1.Ino, s2.Ino, s1.Uid, s1.Gid, s1.Mode&0o7777)
	}
	if l, err := os.Readlink(filepath.Join(dst, "a/sym")); err != nil || l != "../outside/target" {
		t.Errorf("symlink: %q %v", l, err)
	}
	var ws unix.Stat_t
	must(unix.Lstat(filepath.Join(dst, "a/whiteout"), &ws))
	if ws.Mode&unix.S_IFMT != unix.S_IFCHR || ws.Rdev != 0 {
		t.Errorf("whiteout: mode %o rdev %d", ws.Mode, ws.Rdev)
	}
	x := make([]byte, 4)
	if n, err := unix.Getxattr(filepath.Join(dst, "a"), "trusted.overlay.opaque", x); err != nil || string(x[:n]) != "y" {
		t.Errorf("opaque xattr: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "empty")); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("setuid bit lost: %v", fi.Mode())
	}
	if fi, err := os.Stat(filepath.Join(dst, "a")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("dir mode: %v", fi.Mode())
	}
}

func tarOf(t *testing.T, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func TestUnpackDeltaRefusesUnsafe(t *testing.T) {
	dir := &tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}
	tests := []struct {
		name string
		hdrs []*tar.Header
	}{
		{"dotdot", []*tar.Header{{Name: "../x", Typeflag: tar.TypeReg, Size: 1}}},
		{"inner dotdot", []*tar.Header{dir, {Name: "d/../../x", Typeflag: tar.TypeReg, Size: 1}}},
		{"absolute", []*tar.Header{{Name: "/etc/passwd", Typeflag: tar.TypeReg, Size: 1}}},
		{"char device", []*tar.Header{{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}},
		{"block device", []*tar.Header{{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8}}},
		{"hard link out", []*tar.Header{{Name: "l", Typeflag: tar.TypeLink, Linkname: "../../etc/shadow"}}},
		{"hard link to absent", []*tar.Header{{Name: "l", Typeflag: tar.TypeLink, Linkname: "nothing"}}},
		{"through symlink", []*tar.Header{{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "/"}, {Name: "s/etc/x", Typeflag: tar.TypeReg, Size: 1}}},
		{"missing parent", []*tar.Header{{Name: "no/such/dir/x", Typeflag: tar.TypeReg, Size: 1}}},
		{"root", []*tar.Header{{Name: "./", Typeflag: tar.TypeDir}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := tarOf(t, tc.hdrs...)
			parent := t.TempDir()
			dst := filepath.Join(parent, "root")
			os.Mkdir(dst, 0o755)
			err := image.UnpackDelta(bytes.NewReader(b), dst)
			if !errors.Is(err, image.ErrUnsafeEntry) {
				t.Fatalf("UnpackDelta = %v, want ErrUnsafeEntry", err)
			}
			ents, _ := os.ReadDir(parent)
			if len(ents) != 1 {
				t.Fatalf("something was written beside the root: %v", ents)
			}
		})
	}
}

// FuzzUnpackDelta feeds arbitrary bytes as a fs delta: it must never panic
// nor write outside the destination.
func FuzzUnpackDelta(f *testing.F) {
	f.Add(tarOfF(f, &tar.Header{Name: "a", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(tarOfF(f, &tar.Header{Name: "../a", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(tarOfF(f, &tar.Header{Name: "d/", Typeflag: tar.TypeDir}, &tar.Header{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: ".."}))
	f.Add([]byte("not a tar"))
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		parent, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(parent)
		dst := filepath.Join(parent, "root")
		os.Mkdir(dst, 0o755)
		_ = image.UnpackDelta(bytes.NewReader(b), dst)
		ents, _ := os.ReadDir(parent)
		if len(ents) != 1 {
			t.Fatalf("wrote outside the root: %v", ents)
		}
	})
}

func tarOfF(f *testing.F, hdrs ...*tar.Header) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		tw.WriteHeader(h)
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// FuzzManifest feeds arbitrary bytes as a manifest: Load must return a
// manifest or ErrCorrupt, never panic.
func FuzzManifest(f *testing.F) {
	f.Add([]byte(`{"version":1,"container":"a","seq":1,"files":[{"path":"fs.tar","size":1,"blake3":"` + string(bytes.Repeat([]byte("0"), 64)) + `"}]}`))
	f.Add([]byte(`{"version":1,"files":[{"path":"../x","size":-1}]}`))
	f.Add([]byte(`{`))
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(d)
		repo := image.Repo{Dir: d}
		dir := repo.Path("a", 1)
		os.MkdirAll(dir, 0o700)
		os.WriteFile(filepath.Join(dir, image.ManifestName), b, 0o600)
		m, err := repo.Load("a", 1)
		if err != nil && !errors.Is(err, image.ErrCorrupt) {
			t.Fatalf("Load: %v", err)
		}
		if err == nil {
			for _, f := range m.Files {
				if f.Size < 0 || filepath.IsAbs(f.Path) {
					t.Fatalf("accepted bad entry %+v", f)
				}
			}
			// Verify of an accepted manifest must not panic either.
			_, _ = repo.Verify(context.Background(), "a", 1)
		}
	})
}

func TestRepoWriteVerifyMaterialize(t *testing.T) {
	repo := image.Repo{Dir: t.TempDir()}
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, image.CRIUDir), 0o700)
	os.WriteFile(filepath.Join(src, image.CRIUDir, "pages-1.img"), bytes.Repeat([]byte{7}, 100_000), 0o600)
	os.WriteFile(filepath.Join(src, image.DeltaName), tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3}), 0o600)
	ctx := context.Background()
	if n := repo.NextSeq("c"); n != 1 {
		t.Fatalf("NextSeq = %d", n)
	}
	m := &image.Manifest{Container: "c", Seq: 1, Config: []byte(`{}`)}
	if err := repo.Write(ctx, src, m); err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != 2 || m.Size() != 100_000+int64(len(tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3}))) {
		t.Fatalf("files %+v", m.Files)
	}
	if err := repo.Write(ctx, src, &image.Manifest{Container: "c", Seq: 1}); err == nil {
		t.Fatal("second write of c:1 succeeded")
	}
	if n := repo.NextSeq("c"); n != 2 {
		t.Fatalf("NextSeq = %d", n)
	}
	if _, err := repo.Verify(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "x")
	if _, err := repo.Materialize(ctx, "c", 1, dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, image.CRIUDir, "pages-1.img")); len(b) != 100_000 {
		t.Fatalf("materialized %d bytes", len(b))
	}
	// An interrupted write (a .tmp dir) is never listed and is cleaned.
	os.MkdirAll(repo.Path("c", 2)+".tmp", 0o700)
	if ms, errs := repo.List("c"); len(ms) != 1 || len(errs) != 0 {
		t.Fatalf("List = %d, %v", len(ms), errs)
	}
	repo.CleanTemp("c")
	if _, err := os.Stat(repo.Path("c", 2) + ".tmp"); !os.IsNotExist(err) {
		t.Fatal("CleanTemp left the .tmp dir")
	}
	if err := repo.Remove("c", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Load("c", 1); !errors.Is(err, image.ErrNotFound) {
		t.Fatalf("Load after Remove: %v", err)
	}
}
