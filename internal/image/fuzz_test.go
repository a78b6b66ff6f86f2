package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/store"
)

// onlyIn fails the test if dir holds anything but entries named allowed.
func onlyIn(t *testing.T, dir string, allowed ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !slices.Contains(allowed, e.Name()) {
			t.Fatalf("written in %s outside %v: %s", dir, allowed, e.Name())
		}
	}
}

// checkCatalog fails the test unless every entry of the repo's catalog is
// a record of a validly named checkpoint that verifies.
func checkCatalog(t *testing.T, repo image.Repo) {
	t.Helper()
	if strays, err := repo.Strays(); err != nil || len(strays) != 0 {
		t.Fatalf("catalog holds strays %v (%v)", strays, err)
	}
	recs, errs := repo.All()
	if len(errs) != 0 {
		t.Fatalf("catalog holds unreadable records: %v", errs)
	}
	for _, rec := range recs {
		if names.Container(rec.Container) != nil || names.Seq(rec.Seq) != nil {
			t.Fatalf("listed checkpoint %q", rec.Name())
		}
		if _, err := repo.Verify(context.Background(), rec.Container, rec.Seq, true, nil); err != nil {
			t.Fatalf("listed checkpoint %s does not verify: %v", rec.Name(), err)
		}
	}
}

// FuzzImportFile feeds arbitrary bytes to Import as an export file: it
// fails, or lists a checkpoint that verifies, under a valid name; either
// way nothing is written outside the data dir.
func FuzzImportFile(f *testing.F) {
	file := exportFile(f)
	f.Add(file)
	f.Add(file[:len(file)/2])
	f.Add(withRecord(f, file, func(rec map[string]any) { rec["container"] = "../../x" }))
	f.Add(withRecord(f, file, func(rec map[string]any) { rec["seq"] = -1 }))
	f.Add([]byte(store.ExportMagic))
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(d)
		data2 := filepath.Join(d, "data")
		repo := image.Repo{Dir: filepath.Join(data2, "checkpoints"), StoreDir: filepath.Join(data2, "store"), Compression: store.CompressionFastest}
		_, err = repo.Import(context.Background(), bytes.NewReader(data), "", nil)
		onlyIn(t, d, "data")
		onlyIn(t, data2, "checkpoints", "store")
		if err != nil {
			if recs, _ := repo.All(); len(recs) != 0 {
				t.Fatalf("failed Import (%v) listed %v", err, recs)
			}
			return
		}
		checkCatalog(t, repo)
	})
}

// FuzzReceive feeds arbitrary bytes to Receive as checkpoint c:2 sent by
// a peer, into a repo that holds c:1 (so that delta streams against it
// get far): it fails, or lists c:2 and it verifies; either way nothing is
// written outside the data dir.
func FuzzReceive(f *testing.F) {
	ctx := context.Background()
	src := newRepo(f)
	core := seeded(31, 1000) // small seeds keep the fuzzer's minimizing short
	delta := tarOf(f, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	for seq, pages := range map[int][]byte{1: seeded(32, 2*4096), 2: append(seeded(32, 4096), seeded(33, 4096)...)} {
		if err := src.Ingest(ctx, stage(f, map[string][]byte{"core-1.img": core, "pages-1.img": pages}, delta), &image.Record{Container: "c", Seq: seq, Config: []byte(`{}`)}, nil); err != nil {
			f.Fatal(err)
		}
	}
	var base1, full2, delta2 bytes.Buffer
	if _, err := src.Export(ctx, "c", 1, &base1, nil); err != nil {
		f.Fatal(err)
	}
	if _, err := src.Export(ctx, "c", 2, &full2, nil); err != nil {
		f.Fatal(err)
	}
	ids1, err := src.ChunkIDs(ctx, "c", 1)
	if err != nil {
		f.Fatal(err)
	}
	has := map[store.ID]bool{}
	for _, id := range ids1 {
		has[id] = true
	}
	if _, err := src.ExportDelta(ctx, "c", 2, &delta2, func(id store.ID) bool { return has[id] }, nil); err != nil {
		f.Fatal(err)
	}
	f.Add(delta2.Bytes())
	f.Add(full2.Bytes())
	f.Add(base1.Bytes()) // c:1, not what was asked for
	f.Add(withRecord(f, delta2.Bytes(), func(rec map[string]any) { rec["container"] = "../../x" }))
	f.Add(delta2.Bytes()[:delta2.Len()-1])
	tmp := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := os.MkdirTemp(tmp, "")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(d)
		data2 := filepath.Join(d, "data")
		repo := image.Repo{Dir: filepath.Join(data2, "checkpoints"), StoreDir: filepath.Join(data2, "store"), Compression: store.CompressionFastest}
		if _, err := repo.Receive(ctx, bytes.NewReader(base1.Bytes()), "c", 1, nil); err != nil {
			t.Fatal(err)
		}
		rec, err := repo.Receive(ctx, bytes.NewReader(data), "c", 2, nil)
		onlyIn(t, d, "data")
		onlyIn(t, data2, "checkpoints", "store")
		if err == nil && rec.Name() != "c:2" {
			t.Fatalf("Receive of c:2 returned %s", rec.Name())
		}
		recs, _ := repo.All()
		if err != nil && len(recs) != 1 {
			t.Fatalf("failed Receive (%v) listed %v", err, recs)
		}
		checkCatalog(t, repo)
	})
}

// FuzzReceiveStaged feeds arbitrary bytes to ReceiveStaged, the first
// byte b of each input announcing b/128 times the length of the rest (an
// integer argument would make the fuzzer's minimizer count it down one by
// one): it fails, or leaves only a record with a valid name, an fs delta
// that UnpackDelta unpacks inside its root, and plain CRIU files; nothing
// is ever written outside the target dir, and never more than announced.
func FuzzReceiveStaged(f *testing.F) {
	delta := stagedDelta(f)
	good, _ := stagedStream(f, file("record.json", stagedRec), file("fs.tar", delta), file("criu/pages-1.img", seeded(5, 4096)), file("criu/core-1.img", []byte("core")))
	f.Add(append([]byte{128}, good...))
	f.Add(append([]byte{120}, good...))
	f.Add(append([]byte{128}, good[:len(good)/2]...))
	bad, _ := stagedStream(f, file("record.json", stagedRec), file("fs.tar", tarOf(f, &tar.Header{Name: "../x", Typeflag: tar.TypeReg, Size: 1})), file("criu/../../x", []byte("x")))
	f.Add(append([]byte{128}, bad...))
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, input []byte) {
		if len(input) == 0 {
			return
		}
		data := input[1:]
		announced := int64(len(data)) * int64(input[0]) / 128
		d, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(d)
		dir := filepath.Join(d, "stage")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		rec, n, err := image.ReceiveStaged(bytes.NewReader(data), dir, announced)
		onlyIn(t, d, "stage")
		var total int64
		werr := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			switch {
			case rel == "." || rel == "criu" && e.IsDir():
				return nil
			case !e.Type().IsRegular():
				t.Fatalf("ReceiveStaged made %s, not a plain file", rel)
			case rel != "fs.tar" && (!strings.HasPrefix(rel, "criu/") || strings.Count(rel, "/") != 1):
				t.Fatalf("ReceiveStaged wrote %s", rel)
			}
			fi, err := e.Info()
			if err == nil {
				total += fi.Size()
			}
			return err
		})
		if werr != nil {
			t.Fatal(werr)
		}
		if total > max(announced, 0) || total > n {
			t.Fatalf("ReceiveStaged wrote %d bytes of files, announced %d, reported %d", total, announced, n)
		}
		if err != nil {
			return
		}
		if names.Container(rec.Container) != nil || names.Seq(rec.Seq) != nil {
			t.Fatalf("ReceiveStaged accepted a record of %q", rec.Name())
		}
		root := filepath.Join(d, "root")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		if os.Getuid() == 0 { // whiteouts and owners need root
			// It may still refuse the delta (a missing parent); it must
			// never write outside root.
			_ = image.UnpackDelta(context.Background(), filepath.Join(dir, image.DeltaName), root)
		}
		ents, _ := os.ReadDir(d)
		if len(ents) != 2 {
			t.Fatalf("UnpackDelta wrote beside its root: %v", ents)
		}
	})
}
