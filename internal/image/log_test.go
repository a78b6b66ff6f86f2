package image_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cairn-hpc/cairn/internal/image"
)

// outputLines is n numbered lines of output, as a program prints them.
func outputLines(from, n int) []byte {
	var b bytes.Buffer
	for i := from; i < from+n; i++ {
		fmt.Fprintf(&b, "step %d: residual %.9f\n", i, 1/float64(i+1))
	}
	return b.Bytes()
}

func readLog(t *testing.T, repo image.Repo, rec *image.Record) ([]byte, bool) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "log")
	ok, err := repo.MaterializeLog(context.Background(), rec, p)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return nil, false
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b, true
}

// TestImageKeepsOutput: the container's output staged with an image is
// stored with it, travels with it to a peer and in a staged-image stream,
// and comes back byte for byte; a later checkpoint, whose output only
// grew, stores little more than what was added.
func TestImageKeepsOutput(t *testing.T) {
	ctx := context.Background()
	repo := newRepo(t)
	delta := stagedDelta(t)
	pages := seeded(7, 8*4096)
	log1 := outputLines(1, 20_000)

	src := stage(t, map[string][]byte{"pages-1.img": pages}, delta)
	if err := os.WriteFile(filepath.Join(src, image.LogName), log1, 0o600); err != nil {
		t.Fatal(err)
	}
	rec1 := &image.Record{Container: "c", Seq: 1, Log: &image.LogInfo{Incarnation: 1, Bytes: int64(len(log1))}}
	if err := repo.Ingest(ctx, src, rec1, nil); err != nil {
		t.Fatal(err)
	}
	if got, ok := readLog(t, repo, rec1); !ok || !bytes.Equal(got, log1) {
		t.Fatalf("c:1 kept %d bytes of output (kept: %v), staged %d", len(got), ok, len(log1))
	}
	if _, err := repo.Verify(ctx, "c", 1, true, nil); err != nil {
		t.Fatalf("verify c:1: %v", err)
	}
	// Restore's files hold nothing of the output.
	criuDst, fsDst := t.TempDir(), t.TempDir()
	if err := repo.Materialize(ctx, rec1, criuDst, fsDst, nil); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{criuDst, fsDst} {
		if _, err := os.Stat(filepath.Join(d, image.LogName)); err == nil {
			t.Errorf("Materialize wrote the output into %s", d)
		}
	}

	// The record and the output travel to a peer.
	var stream bytes.Buffer
	if _, err := repo.Export(ctx, "c", 1, &stream, nil); err != nil {
		t.Fatal(err)
	}
	peer := newRepo(t)
	got1, err := peer.Receive(ctx, &stream, "c", 1, nil)
	if err != nil {
		t.Fatalf("receive c:1: %v", err)
	}
	if got1.Log == nil || *got1.Log != *rec1.Log {
		t.Errorf("the peer's record says %+v of the output, want %+v", got1.Log, rec1.Log)
	}
	if got, ok := readLog(t, peer, got1); !ok || !bytes.Equal(got, log1) {
		t.Fatalf("the peer's c:1 kept %d bytes of output, staged %d", len(got), len(log1))
	}

	// The output only grows: the next checkpoint stores the new lines and
	// the chunk that ended the old output (cut at its end, not by
	// content), not the whole output again.
	log2 := append(bytes.Clone(log1), outputLines(20_001, 500)...)
	src2 := stage(t, map[string][]byte{"pages-1.img": pages}, delta)
	if err := os.WriteFile(filepath.Join(src2, image.LogName), log2, 0o600); err != nil {
		t.Fatal(err)
	}
	rec2 := &image.Record{Container: "c", Seq: 2}
	if err := repo.Ingest(ctx, src2, rec2, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := readLog(t, repo, rec2); !bytes.Equal(got, log2) {
		t.Fatalf("c:2 kept %d bytes of output, staged %d", len(got), len(log2))
	}
	added := int64(len(log2) - len(log1))
	t.Logf("output %d bytes, then %d more: the second checkpoint stored %d new bytes", len(log1), added, rec2.NewBytes)
	if rec2.NewBytes > added+512<<10 {
		t.Errorf("c:2 stored %d new bytes for %d bytes of new output", rec2.NewBytes, added)
	}

	// A staged-image stream carries it too.
	var staged bytes.Buffer
	var announced int64
	if err := image.WriteStaged(&staged, src2, rec2, func(n int64) { announced = n }); err != nil {
		t.Fatal(err)
	}
	dir, _, _, err := receiveInto(t, staged.Bytes(), announced)
	if err != nil {
		t.Fatalf("ReceiveStaged = %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, image.LogName)); err != nil || !bytes.Equal(b, log2) {
		t.Fatalf("the staged stream's output: %d bytes, %v; want %d", len(b), err, len(log2))
	}

	// An image from before the output was kept has none.
	rec3 := &image.Record{Container: "c", Seq: 3}
	if err := repo.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": pages}, delta), rec3, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := readLog(t, repo, rec3); ok {
		t.Fatal("an image without output has some")
	}
}
