package image_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/image"
)

// entry is one file of a hand-made staged-image stream.
type entry struct {
	hdr  tar.Header
	data []byte
}

func file(name string, data []byte) entry {
	return entry{tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(data))}, data}
}

// stagedStream writes entries as a tar and returns it with the size
// WriteStaged would announce for it.
func stagedStream(t testing.TB, entries ...entry) ([]byte, int64) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var size int64
	for _, e := range entries {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if len(e.data) > 0 {
			if _, err := tw.Write(e.data); err != nil {
				t.Fatal(err)
			}
		}
		size += h.Size
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), size
}

var (
	stagedRec   = []byte(`{"version":2,"container":"job.0","seq":3}`)
	stagedDelta = func(t testing.TB) []byte {
		return tarOf(t, &tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
			&tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644},
			&tar.Header{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "../../etc/passwd"},
			&tar.Header{Name: "d/h", Typeflag: tar.TypeLink, Linkname: "d/f"},
			&tar.Header{Name: "w", Typeflag: tar.TypeChar, Mode: 0o600})
	}
)

// receiveInto runs ReceiveStaged into DIR/stage and fails the test if
// anything appears in DIR beside it.
func receiveInto(t *testing.T, stream []byte, announced int64) (string, image.Record, int64, error) {
	t.Helper()
	parent := t.TempDir()
	dir := filepath.Join(parent, "stage")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec, n, err := image.ReceiveStaged(bytes.NewReader(stream), dir, announced)
	if ents, _ := os.ReadDir(parent); len(ents) != 1 {
		t.Fatalf("ReceiveStaged wrote beside its dir: %v", ents)
	}
	return dir, rec, n, err
}

// TestReceiveStaged: a staged-image stream is taken as WriteStaged writes
// it; one larger than announced, or holding anything a staged image does
// not hold or restore would refuse, is refused with a clear error.
func TestReceiveStaged(t *testing.T) {
	delta := stagedDelta(t)
	pages := seeded(5, 3*4096)
	good := []entry{file("record.json", stagedRec), file("fs.tar", delta), file("criu/pages-1.img", pages), file("criu/core-1.img", []byte("core"))}

	t.Run("written by WriteStaged", func(t *testing.T) {
		src := t.TempDir()
		os.Mkdir(filepath.Join(src, "criu"), 0o700)
		os.WriteFile(filepath.Join(src, "criu", "pages-1.img"), pages, 0o600)
		os.WriteFile(filepath.Join(src, "fs.tar"), delta, 0o600)
		var buf bytes.Buffer
		var announced int64 = -1
		rec := &image.Record{Version: image.RecordVersion, Container: "job.0", Seq: 3}
		if err := image.WriteStaged(&buf, src, rec, func(n int64) { announced = n }); err != nil {
			t.Fatal(err)
		}
		dir, got, n, err := receiveInto(t, buf.Bytes(), announced)
		if err != nil {
			t.Fatalf("ReceiveStaged = %v", err)
		}
		if got.Name() != "job.0:3" || n != announced || n <= int64(len(delta)+len(pages)) {
			t.Errorf("received %s, %d bytes (announced %d)", got.Name(), n, announced)
		}
		for name, want := range map[string][]byte{"fs.tar": delta, "criu/pages-1.img": pages} {
			if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(b, want) {
				t.Errorf("%s: %v", name, err)
			}
		}
		// One byte less announced than sent.
		if _, _, _, err := receiveInto(t, buf.Bytes(), announced-1); !errors.Is(err, image.ErrStagedTooLarge) || !errors.Is(err, image.ErrCorrupt) {
			t.Errorf("ReceiveStaged with one byte less announced = %v, want ErrStagedTooLarge", err)
		}
	})

	stream, size := stagedStream(t, good...)
	if _, _, _, err := receiveInto(t, stream, size); err != nil {
		t.Fatalf("ReceiveStaged of a good stream = %v", err)
	}

	hostileDelta := func(hdrs ...*tar.Header) []entry {
		return []entry{file("record.json", stagedRec), file("fs.tar", tarOf(t, hdrs...)), file("criu/core-1.img", []byte("core"))}
	}
	with := func(e ...entry) []entry { return append(slices.Clone(good), e...) }
	tests := []struct {
		name    string
		entries []entry
		want    string // in the error
	}{
		{"dotdot", with(file("../x", []byte("x"))), "neither"},
		{"absolute", with(file("/etc/x", []byte("x"))), "absolute"},
		{"criu dotdot", with(file("criu/..", []byte("x"))), "not a file name"},
		{"criu nested", with(file("criu/a/b", []byte("x"))), "not directly"},
		{"criu escape", with(file("criu/../../x", []byte("x"))), "not directly"},
		{"stray file", with(file("notes.txt", []byte("x"))), "neither"},
		{"twice", with(file("criu/core-1.img", []byte("again"))), "twice"},
		{"symlink", with(entry{tar.Header{Name: "criu/l", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}, nil}), "only plain files"},
		{"hard link", with(entry{tar.Header{Name: "criu/h", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}, nil}), "only plain files"},
		{"char device", with(entry{tar.Header{Name: "criu/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}, nil}), "only plain files"},
		{"dir", with(entry{tar.Header{Name: "criu/d/", Typeflag: tar.TypeDir, Mode: 0o755}, nil}), "only plain files"},
		{"delta dotdot", hostileDelta(&tar.Header{Name: "../x", Typeflag: tar.TypeReg, Size: 1}), "leaves the root"},
		{"delta absolute", hostileDelta(&tar.Header{Name: "/etc/passwd", Typeflag: tar.TypeReg, Size: 1}), "absolute"},
		{"delta device", hostileDelta(&tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}), "character device"},
		{"delta block device", hostileDelta(&tar.Header{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8}), "block device"},
		{"delta link out", hostileDelta(&tar.Header{Name: "l", Typeflag: tar.TypeLink, Linkname: "../../etc/shadow"}), "leaves the root"},
		{"delta link to absent", hostileDelta(&tar.Header{Name: "l", Typeflag: tar.TypeLink, Linkname: "nothing"}), "not a file in the delta"},
		{"delta not a tar", []entry{file("record.json", stagedRec), file("fs.tar", bytes.Repeat([]byte("x"), 1024)), file("criu/core-1.img", []byte("core"))}, "fs delta"},
		{"record names a path", []entry{file("record.json", []byte(`{"container":"../../x","seq":3}`)), file("fs.tar", delta), file("criu/core-1.img", []byte("c"))}, "invalid container name"},
		{"record seq 0", []entry{file("record.json", []byte(`{"container":"job.0","seq":0}`)), file("fs.tar", delta), file("criu/core-1.img", []byte("c"))}, "invalid checkpoint number"},
		{"no criu files", []entry{file("record.json", stagedRec), file("fs.tar", delta)}, "no CRIU image files"},
		{"no record", []entry{file("fs.tar", delta), file("criu/core-1.img", []byte("c"))}, "no record"},
		{"no delta", []entry{file("record.json", stagedRec), file("criu/core-1.img", []byte("c"))}, "no fs delta"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stream, size := stagedStream(t, tc.entries...)
			_, _, _, err := receiveInto(t, stream, size)
			if !errors.Is(err, image.ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReceiveStaged = %v, want ErrCorrupt saying %q", err, tc.want)
			}
		})
	}

	t.Run("sizes", func(t *testing.T) {
		// More than announced: refused before the file that goes past it
		// is written.
		stream, size := stagedStream(t, good...)
		dir, _, _, err := receiveInto(t, stream, size-4)
		if !errors.Is(err, image.ErrStagedTooLarge) {
			t.Fatalf("ReceiveStaged of %d bytes announced as %d = %v, want ErrStagedTooLarge", size, size-4, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "criu", "core-1.img")); err == nil {
			t.Error("the file past the announced size was written")
		}
		// An announced size beyond the maximum, or negative.
		for _, n := range []int64{image.MaxStagedSize + 1, -1} {
			if _, _, _, err := receiveInto(t, stream, n); !errors.Is(err, image.ErrStagedTooLarge) {
				t.Errorf("ReceiveStaged announced as %d = %v, want ErrStagedTooLarge", n, err)
			}
		}
		// A header claiming more than the stream holds.
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "criu/pages-1.img", Typeflag: tar.TypeReg, Size: 1 << 40})
		tw.Write([]byte("short"))
		if _, _, _, err := receiveInto(t, buf.Bytes(), 1<<20); !errors.Is(err, image.ErrStagedTooLarge) {
			t.Errorf("ReceiveStaged of an entry claiming 1 TiB = %v, want ErrStagedTooLarge", err)
		}
	})
}

// hole is an entry of a staged-image stream that stands for a pages file
// of the given size, its bytes left out (WriteStagedLazy).
func hole(name, size string) entry {
	return entry{tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o600, Format: tar.FormatPAX,
		PAXRecords: map[string]string{image.StagedHoleSize: size}}, nil}
}

// TestReceiveStagedHoles: a stream written without its pages (a
// post-copy migration's) carries each pages file as a hole of its size,
// which the receiver makes empty of that size and counts in no byte; a
// hole for anything but a pages file, with bytes in it, or of a size
// that is not whole pages within the bounds is refused.
func TestReceiveStagedHoles(t *testing.T) {
	delta := stagedDelta(t)
	pages := seeded(7, 5*4096)
	src := t.TempDir()
	os.Mkdir(filepath.Join(src, "criu"), 0o700)
	os.WriteFile(filepath.Join(src, "criu", "pages-1.img"), pages, 0o600)
	os.WriteFile(filepath.Join(src, "criu", "pagemap-1.img"), []byte("pagemap"), 0o600)
	os.WriteFile(filepath.Join(src, "fs.tar"), delta, 0o600)
	var buf bytes.Buffer
	var announced int64 = -1
	rec := &image.Record{Version: image.RecordVersion, Container: "job.0", Seq: 3}
	if err := image.WriteStagedLazy(&buf, src, rec, func(n int64) { announced = n }); err != nil {
		t.Fatal(err)
	}
	if announced >= int64(len(pages)) || buf.Len() >= len(pages) {
		t.Fatalf("a stream without pages announced %d bytes and is %d long; the pages alone are %d", announced, buf.Len(), len(pages))
	}
	dir, got, n, err := receiveInto(t, buf.Bytes(), announced)
	if err != nil || got.Name() != "job.0:3" || n != announced {
		t.Fatalf("ReceiveStaged = %s, %d bytes (announced %d), %v", got.Name(), n, announced, err)
	}
	fi, err := os.Stat(filepath.Join(dir, "criu", "pages-1.img"))
	if err != nil || fi.Size() != int64(len(pages)) {
		t.Fatalf("the hole for pages-1.img: %v, %v; want %d bytes", fi, err, len(pages))
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "criu", "pages-1.img")); !bytes.Equal(b, make([]byte, len(pages))) {
		t.Error("the hole for pages-1.img has bytes in it")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "criu", "pagemap-1.img")); string(b) != "pagemap" {
		t.Errorf("pagemap-1.img = %q: only pages files are left out", b)
	}

	base := []entry{file("record.json", stagedRec), file("fs.tar", delta), file("criu/core-1.img", []byte("core"))}
	withBytes := hole("criu/pages-2.img", "4096")
	withBytes.hdr.Size, withBytes.data = 4096, make([]byte, 4096)
	for _, tc := range []struct {
		name string
		e    entry
		want string
	}{
		{"a hole for a CRIU file that is not pages", hole("criu/core-2.img", "4096"), "not a pages file"},
		{"a hole for the output", hole(image.LogName, "4096"), "not a pages file"},
		{"a hole with bytes", withBytes, "a hole with 4096 bytes"},
		{"a hole of part of a page", hole("criu/pages-2.img", "4095"), "not whole pages"},
		{"a hole of a negative size", hole("criu/pages-2.img", "-4096"), "not whole pages"},
		{"a hole of no number", hole("criu/pages-2.img", "4k"), "not whole pages"},
		{"a hole past the bound", hole("criu/pages-2.img", fmt.Sprint(image.MaxStagedSize+4096)), "not whole pages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream, size := stagedStream(t, append(slices.Clone(base), tc.e)...)
			if _, _, _, err := receiveInto(t, stream, size); !errors.Is(err, image.ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReceiveStaged = %v, want ErrCorrupt saying %q", err, tc.want)
			}
		})
	}
	t.Run("holes past the bound in all", func(t *testing.T) {
		half := fmt.Sprint(image.MaxStagedSize/2 + 4096)
		stream, size := stagedStream(t, append(slices.Clone(base), hole("criu/pages-1.img", half), hole("criu/pages-2.img", half))...)
		if _, _, _, err := receiveInto(t, stream, size); !errors.Is(err, image.ErrStagedTooLarge) {
			t.Fatalf("ReceiveStaged = %v, want ErrStagedTooLarge", err)
		}
	})
}
