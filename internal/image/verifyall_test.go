package image_test

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cairn-hpc/cairn/internal/image"
)

// TestVerifyAll: every checkpoint of a container and of the repo is
// verified, a stray of the catalog and an unreadable record are problems,
// the callbacks hear of each as it is found, and a container without
// checkpoints is not found.
func TestVerifyAll(t *testing.T) {
	repo := newRepo(t)
	ctx := context.Background()
	delta := tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	for seq := 1; seq <= 2; seq++ {
		rec := &image.Record{Container: "c", Seq: seq, Config: []byte(`{}`)}
		if err := repo.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": randBytes(8192)}, delta), rec, nil); err != nil {
			t.Fatal(err)
		}
	}
	var heard []string
	opts := image.VerifyOptions{ReadData: true, Result: func(r image.VerifyResult) { heard = append(heard, r.Checkpoint) }}
	rep, err := repo.VerifyAll(ctx, []image.Ref{{Container: "c"}, {Container: "c", Seq: 1}}, opts)
	if err != nil || rep.Bad != 0 || len(rep.Checkpoints) != 3 || rep.Store != nil {
		t.Fatalf("VerifyAll(c, c:1) = %+v, %v", rep, err)
	}
	if want := []string{"c:1", "c:2", "c:1"}; len(heard) != 3 || heard[0] != want[0] || heard[1] != want[1] || heard[2] != want[2] {
		t.Errorf("heard %v, want %v", heard, want)
	}
	if _, err := repo.VerifyAll(ctx, []image.Ref{{Container: "none"}}, opts); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("a container without checkpoints: %v", err)
	}

	if err := os.WriteFile(filepath.Join(repo.Dir, "stray"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo.Dir, "c", "3.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	var strays int
	opts.All, opts.Stray = true, func(image.Stray) { strays++ }
	rep, err = repo.VerifyAll(ctx, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Store == nil || len(rep.Store.Problems) != 0 || len(rep.Catalog) != 1 || strays != 1 {
		t.Errorf("--all: store %+v, catalog %v (heard %d)", rep.Store, rep.Catalog, strays)
	}
	bad := 0
	for _, r := range rep.Checkpoints {
		if !r.OK {
			bad++
		}
	}
	if bad != 1 || rep.Bad != 2 {
		t.Errorf("--all: %d bad checkpoints, %d problems, want 1 and 2: %+v", bad, rep.Bad, rep.Checkpoints)
	}
}
