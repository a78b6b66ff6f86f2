package image_test

import (
	"archive/tar"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/store"
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

// TestGCDuringCheckpoint: a gc that starts while a checkpoint is being
// written (the store's writer held) waits for it, and keeps it: it reads
// the catalog only once it holds the store.
func TestGCDuringCheckpoint(t *testing.T) {
	repo := newRepo(t)
	ctx := context.Background()
	delta := tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	if err := repo.Ingest(ctx, stage(t, map[string][]byte{"core-1.img": randBytes(4096)}, delta), &image.Record{Container: "c", Seq: 1, Config: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}
	w, err := repo.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := repo.GC(ctx, image.GCOptions{Keep: 10})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // gc has begun, and waits for the store
	// The checkpoint's chunks, manifest and record, then the store let go.
	id, _, err := w.Put(ctx, randBytes(4096))
	if err != nil {
		t.Fatal(err)
	}
	m, err := w.PutManifest(ctx, &store.Manifest{Nodes: []store.Node{
		{Path: image.CRIUDir, Kind: store.KindDir, Mode: 0o700},
		{Path: image.CRIUDir + "/core-1.img", Kind: store.KindFile, Mode: 0o600, Size: 4096, Chunks: []store.ID{id}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := image.SaveRecord(repo, &image.Record{Container: "c", Seq: 2, Config: []byte(`{}`), Manifest: m}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := repo.ChunkIDs(ctx, "c", 2); err != nil {
		t.Fatalf("the checkpoint written during gc: %v", err)
	}
}
