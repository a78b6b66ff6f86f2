package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/store"
)

// TestFilesOnlyImage: a files-only image (no CRIU files) is ingested,
// listed as such, verified, materialized, exported and imported, and
// moved as a staged image; its record and its manifest must agree, and
// a record from before the field reads as not files-only.
func TestFilesOnlyImage(t *testing.T) {
	ctx := context.Background()
	repo := newRepo(t)
	delta := tarOf(t, &tar.Header{Name: "state/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "state/count", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})

	// CRIU's dir empty, as a checkpoint leaves it, or absent.
	for seq, src := range map[int]string{1: stage(t, nil, delta), 2: func() string {
		s := stage(t, nil, delta)
		os.Remove(filepath.Join(s, image.CRIUDir))
		return s
	}()} {
		rec := &image.Record{Container: "c", Seq: seq, FilesOnly: true, Config: []byte(`{}`)}
		if err := repo.Ingest(ctx, src, rec, nil); err != nil {
			t.Fatalf("ingest c:%d: %v", seq, err)
		}
		if rec.Files != 0 || rec.Logical != 3 {
			t.Errorf("c:%d: %d CRIU files, %d bytes; want 0 and 3", seq, rec.Files, rec.Logical)
		}
	}
	rec, err := repo.Load("c", 1)
	if err != nil || !rec.FilesOnly {
		t.Fatalf("Load = %+v, %v; want a files-only record", rec, err)
	}
	if _, err := repo.Verify(ctx, "c", 1, true, nil); err != nil {
		t.Fatalf("verify: %v", err)
	}
	criuDst, fsDst := t.TempDir(), t.TempDir()
	if err := repo.Materialize(ctx, rec, criuDst, fsDst, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(fsDst, "state", "count")); err != nil || string(b) != "xxx" {
		t.Errorf("materialized state/count = %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(criuDst); len(ents) != 0 {
		t.Errorf("a files-only image wrote CRIU files: %v", ents)
	}
	var buf bytes.Buffer
	if _, err := repo.Export(ctx, "c", 1, &buf, nil); err != nil {
		t.Fatal(err)
	}
	other := newRepo(t)
	if got, err := other.Import(ctx, bytes.NewReader(buf.Bytes()), "", nil); err != nil || !got.FilesOnly {
		t.Fatalf("Import = %+v, %v; want a files-only record", got, err)
	}

	// CRIU files staged for a files-only record: refused, nothing listed.
	bad := &image.Record{Container: "c", Seq: 3, FilesOnly: true}
	if err := repo.Ingest(ctx, stage(t, map[string][]byte{"core-1.img": []byte("core")}, delta), bad, nil); err == nil {
		t.Error("ingest of a files-only image with CRIU files succeeded")
	}
	if _, err := repo.Load("c", 3); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("Load c:3 = %v, want ErrNotFound", err)
	}

	// The record and the manifest disagree: corrupt, whichever way.
	crius := putRecord(t, repo, []store.Node{{Path: image.CRIUDir, Kind: store.KindDir, Mode: 0o700},
		{Path: "criu/core-1.img", Kind: store.KindFile, Mode: 0o600, Size: 4}, {Path: image.FSDir, Kind: store.KindDir, Mode: 0o755}})
	crius.FilesOnly = true
	if err := repo.Materialize(ctx, crius, t.TempDir(), t.TempDir(), nil); !errors.Is(err, image.ErrCorrupt) {
		t.Errorf("Materialize of CRIU files as files-only = %v, want ErrCorrupt", err)
	}
	rec.FilesOnly = false
	if err := repo.Materialize(ctx, rec, t.TempDir(), t.TempDir(), nil); !errors.Is(err, image.ErrCorrupt) {
		t.Errorf("Materialize of a files-only image as a CRIU one = %v, want ErrCorrupt", err)
	}

	// Staged streams: without CRIU files for a files-only record, and not
	// with them.
	foRec := []byte(`{"version":2,"container":"job.0","seq":3,"files_only":true}`)
	stream, size := stagedStream(t, file("record.json", foRec), file("fs.tar", delta))
	dir, got, _, err := receiveInto(t, stream, size)
	if err != nil || !got.FilesOnly {
		t.Fatalf("ReceiveStaged of a files-only image = %+v, %v", got, err)
	}
	if err := repo.Ingest(ctx, dir, &image.Record{Container: "job.0", Seq: 3, FilesOnly: true}, nil); err != nil {
		t.Fatalf("ingest of the received image: %v", err)
	}
	stream, size = stagedStream(t, file("record.json", foRec), file("fs.tar", delta), file("criu/core-1.img", []byte("c")))
	if _, _, _, err := receiveInto(t, stream, size); !errors.Is(err, image.ErrCorrupt) || !strings.Contains(err.Error(), "files-only") {
		t.Errorf("ReceiveStaged of CRIU files with a files-only record = %v, want ErrCorrupt", err)
	}

	// A record without the field, as every earlier cairn wrote: not
	// files-only.
	var old image.Record
	if err := json.Unmarshal(stagedRec, &old); err != nil || old.FilesOnly {
		t.Errorf("a record without files_only reads as %+v, %v", old, err)
	}
	b, _ := json.Marshal(&image.Record{Container: "c", Seq: 1})
	if bytes.Contains(b, []byte("files_only")) {
		t.Errorf("a CRIU image's record names files_only: %s", b)
	}
}
