package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/store"
)

func newRepo(t testing.TB) image.Repo {
	d := t.TempDir()
	return image.Repo{Dir: filepath.Join(d, "catalog"), StoreDir: filepath.Join(d, "store"), Compression: store.CompressionFastest}
}

// stage writes a staged image: CRIU files and an fs delta tar.
func stage(t testing.TB, criu map[string][]byte, delta []byte) string {
	t.Helper()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, image.CRIUDir), 0o700)
	for name, b := range criu {
		if err := os.WriteFile(filepath.Join(src, image.CRIUDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, image.DeltaName), delta, 0o600); err != nil {
		t.Fatal(err)
	}
	return src
}

func tarOf(t testing.TB, hdrs ...*tar.Header) []byte {
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

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// TestDeltaRoundTrip packs an upper dir with every kind of entry an overlay
// upper dir holds, ingests it and materializes it elsewhere.
func TestDeltaRoundTrip(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (whiteouts, chown, trusted xattrs)")
	}
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	big := randBytes(3 << 20)
	must(os.MkdirAll(filepath.Join(src, "a/b"), 0o750))
	must(os.WriteFile(filepath.Join(src, "a/b/file"), []byte("hello"), 0o604))
	must(os.Chown(filepath.Join(src, "a/b/file"), 42, 43))
	must(os.WriteFile(filepath.Join(src, "a/big"), big, 0o600))
	must(os.Link(filepath.Join(src, "a/b/file"), filepath.Join(src, "a/hard")))
	must(os.Symlink("../outside/target", filepath.Join(src, "a/sym")))
	must(syscall.Mknod(filepath.Join(src, "a/whiteout"), syscall.S_IFCHR, 0))
	must(unix.Mkfifo(filepath.Join(src, "fifo"), 0o600))
	must(unix.Setxattr(filepath.Join(src, "a"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(filepath.Join(src, "empty"), nil, 0o755))
	must(os.Chmod(filepath.Join(src, "empty"), 0o755|os.ModeSetuid))
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	must(os.Chtimes(filepath.Join(src, "a/b/file"), mtime, mtime))

	var buf bytes.Buffer
	st, err := image.PackDelta(src, &buf)
	must(err)
	if st.Whiteouts != 1 || st.Dirs != 2 || st.Bytes != 5+3<<20 {
		t.Errorf("stats %+v", st)
	}
	repo := newRepo(t)
	ctx := context.Background()
	rec := &image.Record{Container: "c", Seq: 1}
	must(repo.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": randBytes(64 << 10)}, buf.Bytes()), rec, nil))

	criuDst, dst := t.TempDir(), t.TempDir()
	must(repo.Materialize(ctx, rec, criuDst, dst, nil))
	if b, err := os.ReadFile(filepath.Join(dst, "a/b/file")); err != nil || string(b) != "hello" {
		t.Errorf("file: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a/big")); err != nil || !bytes.Equal(b, big) {
		t.Errorf("big file differs: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a/hard")); err != nil || string(b) != "hello" {
		t.Errorf("hard link: %q %v", b, err)
	}
	var s1 unix.Stat_t
	must(unix.Stat(filepath.Join(dst, "a/b/file"), &s1))
	if s1.Uid != 42 || s1.Gid != 43 || s1.Mode&0o7777 != 0o604 || s1.Mtim.Nano() != mtime.UnixNano() {
		t.Errorf("file meta: uid %d gid %d mode %o mtime %v", s1.Uid, s1.Gid, s1.Mode&0o7777, time.Unix(0, s1.Mtim.Nano()))
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
	b, err := repo.ReadDeltaFile(ctx, "c", 1, "a/b/file")
	if err != nil || string(b) != "hello" {
		t.Errorf("ReadDeltaFile: %q %v", b, err)
	}
	// Unpacking the captured tar directly (a migration) makes the same tree.
	tarPath := filepath.Join(t.TempDir(), image.DeltaName)
	must(os.WriteFile(tarPath, buf.Bytes(), 0o600))
	dst2 := t.TempDir()
	must(image.UnpackDelta(ctx, tarPath, dst2))
	if a, b := describeTree(t, dst), describeTree(t, dst2); !maps.Equal(a, b) {
		t.Errorf("UnpackDelta made another tree than Materialize:\n%v\n%v", a, b)
	}
}

// describeTree is one line per entry under dir: kind, mode, owner, size,
// mtime, content hash, link target, device and xattrs.
func describeTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		d := fmt.Sprintf("mode %o uid %d gid %d rdev %d", st.Mode, st.Uid, st.Gid, st.Rdev)
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			d += fmt.Sprintf(" size %d sum %x mtime %d", len(b), sha256.Sum256(b), st.Mtim.Nano())
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			d += " -> " + l
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			names := make([]byte, 4096)
			if n, err := unix.Llistxattr(p, names); err == nil {
				d += fmt.Sprintf(" xattrs %q", names[:n])
			}
		}
		out[rel] = d
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestIngestRefusesUnsafeDelta: a captured delta with entries that would
// escape the root or make devices is refused, and nothing is listed.
func TestIngestRefusesUnsafeDelta(t *testing.T) {
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
		{"root", []*tar.Header{{Name: "./", Typeflag: tar.TypeDir}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(t)
			err := repo.Ingest(context.Background(), stage(t, nil, tarOf(t, tc.hdrs...)), &image.Record{Container: "c", Seq: 1}, nil)
			if !errors.Is(err, image.ErrUnsafeEntry) {
				t.Fatalf("Ingest = %v, want ErrUnsafeEntry", err)
			}
			if recs, _ := repo.List("c"); len(recs) != 0 {
				t.Fatal("a refused checkpoint is listed")
			}
			// A migration unpacks the same tar straight into a new root.
			tarPath := filepath.Join(t.TempDir(), image.DeltaName)
			os.WriteFile(tarPath, tarOf(t, tc.hdrs...), 0o600)
			parent := t.TempDir()
			dst := filepath.Join(parent, "root")
			os.Mkdir(dst, 0o755)
			if err := image.UnpackDelta(context.Background(), tarPath, dst); !errors.Is(err, image.ErrUnsafeEntry) {
				t.Fatalf("UnpackDelta = %v, want ErrUnsafeEntry", err)
			}
			if ents, _ := os.ReadDir(parent); len(ents) != 1 {
				t.Fatalf("UnpackDelta wrote beside its root: %v", ents)
			}
		})
	}
}

// putRecord stores a hand-made manifest as checkpoint c:1.
func putRecord(t testing.TB, repo image.Repo, nodes []store.Node) *image.Record {
	t.Helper()
	ctx := context.Background()
	st, err := repo.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i, n := range nodes {
		if n.Kind == store.KindFile && n.Size > 0 {
			id, _, err := st.Put(ctx, bytes.Repeat([]byte("y"), int(n.Size)))
			if err != nil {
				t.Fatal(err)
			}
			nodes[i].Chunks = []store.ID{id}
		}
	}
	id, err := st.PutManifest(ctx, &store.Manifest{Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	return &image.Record{Container: "c", Seq: 1, Manifest: id}
}

// TestMaterializeRefusesUnsafe: a manifest (from a damaged or hostile
// store) that holds devices or paths through its own symlinks is
// refused, and nothing is written outside the destination.
func TestMaterializeRefusesUnsafe(t *testing.T) {
	fsd := store.Node{Path: image.FSDir, Kind: store.KindDir, Mode: 0o755}
	tests := []struct {
		name  string
		nodes []store.Node
	}{
		{"char device", []store.Node{fsd, {Path: "fs/null", Kind: store.KindCharDev, Major: 1, Minor: 3}}},
		{"block device", []store.Node{fsd, {Path: "fs/sda", Kind: store.KindBlockDev, Major: 8}}},
		{"through symlink", []store.Node{fsd, {Path: "fs/s", Kind: store.KindSymlink, Target: "/"}, {Path: "fs/s/escaped", Kind: store.KindFile, Size: 3}}},
		{"missing parent", []store.Node{fsd, {Path: "fs/no/such/x", Kind: store.KindFile, Size: 3}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(t)
			rec := putRecord(t, repo, tc.nodes)
			parent := t.TempDir()
			dst := filepath.Join(parent, "root")
			os.Mkdir(dst, 0o755)
			err := repo.Materialize(context.Background(), rec, t.TempDir(), dst, nil)
			if !errors.Is(err, image.ErrUnsafeEntry) {
				t.Fatalf("Materialize = %v, want ErrUnsafeEntry", err)
			}
			if ents, _ := os.ReadDir(parent); len(ents) != 1 {
				t.Fatalf("something was written beside the root: %v", ents)
			}
			if _, err := os.Stat("/escaped"); err == nil {
				t.Fatal("wrote /escaped")
			}
		})
	}
}

// TestRepoLifecycle: ingest, dedup of a second image, list, verify,
// corruption naming every checkpoint that shares the chunk, remove.
func TestRepoLifecycle(t *testing.T) {
	repo := newRepo(t)
	ctx := context.Background()
	pages := randBytes(1 << 20)
	delta := tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	if n := repo.NextSeq("c"); n != 1 {
		t.Fatalf("NextSeq = %d", n)
	}
	r1 := &image.Record{Container: "c", Seq: 1, Config: []byte(`{}`)}
	if err := repo.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": pages, "core-1.img": []byte("core")}, delta), r1, nil); err != nil {
		t.Fatal(err)
	}
	if r1.Logical != 1<<20+4+3 || r1.Files != 2 || r1.NewChunks == 0 {
		t.Fatalf("record %+v", r1)
	}
	// A second image with one page changed writes one new page chunk.
	pages2 := bytes.Clone(pages)
	copy(pages2[8192:], randBytes(4096))
	r2 := &image.Record{Container: "c", Seq: 2, Config: []byte(`{}`)}
	if err := repo.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": pages2, "core-1.img": []byte("core")}, delta), r2, nil); err != nil {
		t.Fatal(err)
	}
	if r2.NewChunks != 1 || r2.NewBytes != 4096 {
		t.Fatalf("second image wrote %d chunks, %d bytes; want 1 page", r2.NewChunks, r2.NewBytes)
	}
	if err := repo.Ingest(ctx, stage(t, nil, delta), &image.Record{Container: "c", Seq: 2}, nil); err == nil {
		t.Fatal("second ingest of c:2 succeeded")
	}
	if recs, errs := repo.List("c"); len(recs) != 2 || len(errs) != 0 {
		t.Fatalf("List = %d, %v", len(recs), errs)
	}
	for _, seq := range []int{1, 2} {
		if _, err := repo.Verify(ctx, "c", seq, true, nil); err != nil {
			t.Fatalf("verify c:%d: %v", seq, err)
		}
	}
	got := filepath.Join(t.TempDir(), "pages")
	os.Mkdir(got, 0o700)
	if err := repo.Materialize(ctx, r2, got, t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(got, "pages-1.img")); !bytes.Equal(b, pages2) {
		t.Fatal("materialized pages differ")
	}

	// Damage a byte in every pack: the error names the chunk and both
	// checkpoints (they share almost every page).
	packs, _ := filepath.Glob(filepath.Join(repo.StoreDir, "packs", "*", "*"))
	if len(packs) == 0 {
		packs, _ = filepath.Glob(filepath.Join(repo.StoreDir, "*", "*"))
	}
	damaged := 0
	for _, p := range packs {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Size() > 8192 && !strings.Contains(p, "index") {
			b, _ := os.ReadFile(p)
			b[100] ^= 0xff
			os.WriteFile(p, b, 0o600)
			damaged++
		}
	}
	if damaged == 0 {
		t.Fatalf("no pack found among %v", packs)
	}
	_, err := repo.Verify(ctx, "c", 1, true, nil)
	var ce *image.CorruptError
	if !errors.As(err, &ce) || !strings.Contains(ce.What, "chunk") {
		t.Fatalf("verify of a damaged store: %v", err)
	}
	if len(ce.Affected) != 2 {
		t.Errorf("affected = %v, want both checkpoints", ce.Affected)
	}
	if err := repo.Materialize(ctx, r1, t.TempDir(), t.TempDir(), nil); !errors.Is(err, image.ErrCorrupt) {
		t.Errorf("materialize of damaged data: %v", err)
	}

	if err := repo.Remove("c", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Load("c", 1); !errors.Is(err, image.ErrNotFound) {
		t.Fatalf("Load after Remove: %v", err)
	}
	if err := repo.SetPinned("c", 2, true); err != nil {
		t.Fatal(err)
	}
	if r, _ := repo.Load("c", 2); !r.Pinned {
		t.Fatal("pin not recorded")
	}
}

// FuzzIngestDelta feeds arbitrary bytes as a captured fs delta: ingest
// must fail cleanly or produce a checkpoint that materializes inside its
// destination.
func FuzzIngestDelta(f *testing.F) {
	f.Add(tarOf(f, &tar.Header{Name: "a", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(tarOf(f, &tar.Header{Name: "../a", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(tarOf(f, &tar.Header{Name: "d/", Typeflag: tar.TypeDir}, &tar.Header{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: ".."}))
	f.Add([]byte("not a tar"))
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(d)
		repo := image.Repo{Dir: filepath.Join(d, "cat"), StoreDir: filepath.Join(d, "store"), Compression: store.CompressionFastest}
		src := filepath.Join(d, "src")
		os.MkdirAll(filepath.Join(src, image.CRIUDir), 0o700)
		os.WriteFile(filepath.Join(src, image.DeltaName), b, 0o600)
		rec := &image.Record{Container: "c", Seq: 1}
		if err := repo.Ingest(context.Background(), src, rec, nil); err != nil {
			return
		}
		parent := filepath.Join(d, "out")
		dst := filepath.Join(parent, "root")
		os.MkdirAll(dst, 0o755)
		_ = repo.Materialize(context.Background(), rec, filepath.Join(d, "criu"), dst, nil)
		if ents, _ := os.ReadDir(parent); len(ents) != 1 {
			t.Fatalf("wrote outside the root: %v", ents)
		}
	})
}

// FuzzRecord feeds arbitrary bytes as a catalog record: Load returns a
// record or ErrCorrupt, never panics.
func FuzzRecord(f *testing.F) {
	f.Add([]byte(`{"version":2,"container":"a","seq":1,"manifest":"` + strings.Repeat("ab", 32) + `"}`))
	f.Add([]byte(`{"version":2,"container":"b","seq":1}`))
	f.Add([]byte(`{`))
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(d)
		repo := image.Repo{Dir: d, StoreDir: filepath.Join(d, "store")}
		os.MkdirAll(filepath.Join(d, "a"), 0o700)
		os.WriteFile(filepath.Join(d, "a", "1.json"), b, 0o600)
		r, err := repo.Load("a", 1)
		if err != nil && !errors.Is(err, image.ErrCorrupt) {
			t.Fatalf("Load: %v", err)
		}
		if err == nil && (r.Container != "a" || r.Seq != 1 || r.Manifest.IsNull()) {
			t.Fatalf("accepted bad record %+v", r)
		}
	})
}
