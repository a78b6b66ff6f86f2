package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"maps"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/image"
)

// staleSocket leaves a unix socket file at p, as a server that bound it
// and exited does.
func staleSocket(t *testing.T, p string) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: p}); err != nil {
		t.Fatal(err)
	}
}

// TestDeltaKeepsSocketFiles: unix socket files in an upper dir, one a
// server listens on and one a server that has exited left, are captured
// and come back (from the store and from the captured tar) as socket files
// with their mode, owner, times and xattrs, bound to nothing: a
// connection is refused until a restored server binds the path again.
func TestDeltaKeepsSocketFiles(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (chown, trusted xattrs)")
	}
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(src, "run"), 0o755))
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(src, "run/app.sock"), Net: "unix"})
	must(err)
	defer l.Close()
	stale := filepath.Join(src, "stale.sock")
	staleSocket(t, stale)
	must(os.Chmod(stale, 0o640))
	must(os.Chown(stale, 7, 8))
	must(unix.Lsetxattr(stale, "trusted.cairn", []byte("kept"), 0))
	mtime := time.Date(2021, 2, 3, 4, 5, 6, 7, time.UTC)
	must(os.Chtimes(stale, mtime, mtime))

	var buf bytes.Buffer
	st, err := image.PackDelta(src, &buf)
	if err != nil {
		t.Fatalf("PackDelta of a tree with socket files: %v", err)
	}
	if st.Files != 2 || st.Dirs != 1 || st.Bytes != 0 {
		t.Errorf("stats %+v, want 2 files (the sockets) and 1 dir", st)
	}
	repo := newRepo(t)
	ctx := context.Background()
	rec := &image.Record{Container: "c", Seq: 1}
	must(repo.Ingest(ctx, stage(t, map[string][]byte{"core-1.img": []byte("core")}, buf.Bytes()), rec, nil))
	if _, err := repo.Verify(ctx, "c", 1, true, nil); err != nil {
		t.Fatalf("Verify of an image with socket files: %v", err)
	}
	dst := t.TempDir()
	must(repo.Materialize(ctx, rec, t.TempDir(), dst, nil))

	for _, name := range []string{"run/app.sock", "stale.sock"} {
		p := filepath.Join(dst, name)
		var s unix.Stat_t
		must(unix.Lstat(p, &s))
		if s.Mode&unix.S_IFMT != unix.S_IFSOCK {
			t.Errorf("%s: mode %o, want a socket", name, s.Mode)
		}
		_, err := net.Dial("unix", p)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("connect to the made %s: %v, want ECONNREFUSED", name, err)
		}
	}
	var s unix.Stat_t
	must(unix.Lstat(filepath.Join(dst, "stale.sock"), &s))
	if s.Mode&0o7777 != 0o640 || s.Uid != 7 || s.Gid != 8 || s.Mtim.Nano() != mtime.UnixNano() {
		t.Errorf("stale.sock meta: mode %o uid %d gid %d mtime %v", s.Mode&0o7777, s.Uid, s.Gid, time.Unix(0, s.Mtim.Nano()).UTC())
	}
	x := make([]byte, 16)
	if n, err := unix.Lgetxattr(filepath.Join(dst, "stale.sock"), "trusted.cairn", x); err != nil || string(x[:n]) != "kept" {
		t.Errorf("stale.sock xattr: %q, %v", x[:max(n, 0)], err)
	}
	// A migration unpacks the captured tar: the same tree.
	tarPath := filepath.Join(t.TempDir(), image.DeltaName)
	must(os.WriteFile(tarPath, buf.Bytes(), 0o600))
	dst1, dst2 := t.TempDir(), t.TempDir()
	must(repo.Materialize(ctx, rec, t.TempDir(), dst1, nil))
	must(image.UnpackDelta(ctx, tarPath, dst2))
	if a, b := describeTree(t, dst1), describeTree(t, dst2); !maps.Equal(a, b) {
		t.Errorf("UnpackDelta made another tree than Materialize:\n%v\n%v", a, b)
	}
}

// TestSocketEntryWithData: a socket entry of an fs delta holds no data;
// one that claims some is refused by ingest and by a migration's unpack.
func TestSocketEntryWithData(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "s", Typeflag: 'U', Mode: 0o600, Size: 3}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("abc"))
	tw.Close()
	repo := newRepo(t)
	err := repo.Ingest(context.Background(), stage(t, map[string][]byte{"core-1.img": []byte("core")}, buf.Bytes()), &image.Record{Container: "c", Seq: 1}, nil)
	if !errors.Is(err, image.ErrUnsafeEntry) {
		t.Fatalf("Ingest = %v, want ErrUnsafeEntry", err)
	}
	tarPath := filepath.Join(t.TempDir(), image.DeltaName)
	if err := os.WriteFile(tarPath, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := image.UnpackDelta(context.Background(), tarPath, t.TempDir()); !errors.Is(err, image.ErrUnsafeEntry) {
		t.Fatalf("UnpackDelta = %v, want ErrUnsafeEntry", err)
	}
}
