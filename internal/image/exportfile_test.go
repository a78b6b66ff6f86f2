package image_test

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/cairn-hpc/cairn/internal/image"
)

// TestExportFile: an export is a whole file, imported back as it was; a
// failed one leaves no file behind, not even a temporary one.
func TestExportFile(t *testing.T) {
	repo := newRepo(t)
	ctx := context.Background()
	delta := tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	rec := &image.Record{Container: "c", Seq: 1, Config: []byte(`{}`)}
	if err := repo.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": randBytes(8192)}, delta), rec, nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "c.export")
	if _, err := repo.ExportFile(ctx, "c", 1, out, nil); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, err := newRepo(t).Import(ctx, f, "", nil); err != nil || got.Logical != rec.Logical {
		t.Fatalf("import of the export: %+v, %v", got, err)
	}
	if _, err := repo.ExportFile(ctx, "c", 2, filepath.Join(dir, "none"), nil); err == nil {
		t.Fatal("export of a checkpoint that does not exist succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("files beside the export: %v", ents)
	}
}
