package image_test

import (
	"archive/tar"
	"context"
	"slices"
	"testing"

	"cairn/internal/image"
)

// TestGCRetains: gc keeps the newest Keep checkpoints of each container,
// the pinned ones, and those Retain names (another retention's), and
// removes the rest.
func TestGCRetains(t *testing.T) {
	repo := newRepo(t)
	ctx := context.Background()
	delta := tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	for _, c := range []string{"local", "job.0"} {
		for seq := 1; seq <= 4; seq++ {
			rec := &image.Record{Container: c, Seq: seq, Config: []byte(`{}`)}
			if err := repo.Ingest(ctx, stage(t, map[string][]byte{"core-1.img": randBytes(4096)}, delta), rec, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := repo.SetPinned("local", 1, true); err != nil {
		t.Fatal(err)
	}
	res, err := repo.GC(ctx, image.GCOptions{Keep: 1, Retain: func(r *image.Record) bool { return r.Container == "job.0" }})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"local:2", "local:3"}; !slices.Equal(res.Removed, want) {
		t.Errorf("gc removed %v, want %v", res.Removed, want)
	}
	for _, seq := range []int{1, 2, 3, 4} {
		if _, err := repo.Load("job.0", seq); err != nil {
			t.Errorf("retained job.0:%d: %v", seq, err)
		}
		if _, err := repo.Verify(ctx, "job.0", seq, true, nil); err != nil {
			t.Errorf("verify retained job.0:%d after gc: %v", seq, err)
		}
	}
	if _, err := repo.GC(ctx, image.GCOptions{}); err == nil {
		t.Error("gc keeping nothing succeeded")
	}
}
