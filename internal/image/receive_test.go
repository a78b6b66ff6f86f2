package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/store"
)

// seeded returns n pseudo-random bytes drawn from seed.
func seeded(seed uint64, n int) []byte {
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// materialized writes a checkpoint out and returns every file it wrote,
// by path under criu/ or fs/.
func materialized(t *testing.T, repo image.Repo, container string, seq int) map[string][]byte {
	t.Helper()
	rec, err := repo.Load(container, seq)
	if err != nil {
		t.Fatal(err)
	}
	criu, fs := t.TempDir(), t.TempDir()
	if err := repo.Materialize(context.Background(), rec, criu, fs, nil); err != nil {
		t.Fatalf("Materialize %s: %v", rec.Name(), err)
	}
	files := map[string][]byte{}
	for prefix, dir := range map[string]string{"criu": criu, "fs": fs} {
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			b, err := os.ReadFile(p)
			files[prefix+"/"+rel] = b
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// TestReceiveDelta copies a checkpoint to a peer in full, then a second
// one that shares most of its chunks as a delta stream against the peer's
// chunks, and checks that the wire carries little more than the new
// chunks and that the peer restores the same files.
func TestReceiveDelta(t *testing.T) {
	ctx := context.Background()
	a, b := newRepo(t), newRepo(t)
	const pageSize, npages = 4096, 1024 // 4 MiB of memory pages
	pages := seeded(1, npages*pageSize)
	core := bytes.Repeat(seeded(2, 256), 512) // one compressible CDC chunk
	fsDelta := tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	if err := a.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": pages, "core-1.img": core}, fsDelta), &image.Record{Container: "c", Seq: 1, Config: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}
	var full1 bytes.Buffer
	if _, err := a.Export(ctx, "c", 1, &full1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Receive(ctx, bytes.NewReader(full1.Bytes()), "c", 1, nil); err != nil {
		t.Fatalf("Receive full: %v", err)
	}

	// The second checkpoint: 5% of the pages rewritten, scattered, and
	// the small image changed.
	rng := rand.New(rand.NewPCG(3, 4))
	pages2 := bytes.Clone(pages)
	for _, p := range rng.Perm(npages)[:npages/20] {
		copy(pages2[p*pageSize:], seeded(uint64(100+p), pageSize))
	}
	core2 := bytes.Clone(core)
	copy(core2[1000:], "changed")
	if err := a.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": pages2, "core-1.img": core2}, fsDelta), &image.Record{Container: "c", Seq: 2, Config: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}

	ids, err := a.ChunkIDs(ctx, "c", 2)
	if err != nil {
		t.Fatal(err)
	}
	missing, err := b.Missing(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if want := npages/20 + 1; len(missing) != want {
		t.Fatalf("peer misses %d of %d chunks, want %d", len(missing), len(ids), want)
	}
	lacks := map[store.ID]bool{}
	for _, id := range missing {
		lacks[id] = true
	}
	have := func(id store.ID) bool { return !lacks[id] }
	var newStored int64
	st, err := a.OpenReader()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range missing {
		stored, _, ok := st.ChunkSize(id)
		if !ok {
			t.Fatalf("chunk %s not in the sender's store", id.Short())
		}
		newStored += stored
	}
	st.Close()

	var full2, delta bytes.Buffer
	rec2, err := a.Export(ctx, "c", 2, &full2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ExportDelta(ctx, "c", 2, &delta, have, nil); err != nil {
		t.Fatalf("ExportDelta: %v", err)
	}
	// A chunk source, whose manifest is loaded already, sends the same.
	src, err := a.OpenChunkSource(ctx, "c", 2)
	if err != nil {
		t.Fatal(err)
	}
	var fromSource bytes.Buffer
	err = src.ExportDelta(ctx, &fromSource, have)
	src.Close()
	if err != nil {
		t.Fatalf("ChunkSource.ExportDelta: %v", err)
	}
	if !bytes.Equal(fromSource.Bytes(), delta.Bytes()) {
		t.Errorf("ChunkSource.ExportDelta wrote %d bytes unlike Repo.ExportDelta's %d", fromSource.Len(), delta.Len())
	}
	mf, err := os.Stat(filepath.Join(a.StoreDir, "manifests", rec2.Manifest.String()))
	if err != nil {
		t.Fatal(err)
	}
	// Beyond the chunks, a stream carries the manifest (32 bytes per
	// chunk reference), the record and 44 bytes per chunk record.
	overhead := mf.Size() + 8<<10
	t.Logf("wire bytes: full stream %d, delta stream %d; new chunks %d stored bytes (%d chunks), manifest %d bytes",
		full2.Len(), delta.Len(), newStored, len(missing), mf.Size())
	if limit := newStored*12/10 + overhead; int64(delta.Len()) > limit {
		t.Errorf("delta stream is %d bytes, above the bound of %d", delta.Len(), limit)
	}
	if delta.Len() > full2.Len()/5 {
		t.Errorf("delta stream is %d bytes, the full stream %d", delta.Len(), full2.Len())
	}

	// A file meant to stand alone is never a delta stream.
	if _, err := b.Import(ctx, bytes.NewReader(delta.Bytes()), "other", nil); !errors.Is(err, store.ErrDeltaExport) {
		t.Fatalf("Import of a delta stream = %v, want store.ErrDeltaExport", err)
	}

	got, err := b.Receive(ctx, bytes.NewReader(delta.Bytes()), "c", 2, nil)
	if err != nil {
		t.Fatalf("Receive delta: %v", err)
	}
	if got.Name() != "c:2" || got.Manifest != rec2.Manifest {
		t.Fatalf("received %s with manifest %s, want c:2 with %s", got.Name(), got.Manifest.Short(), rec2.Manifest.Short())
	}
	want := materialized(t, a, "c", 2)
	if !bytes.Equal(want["criu/pages-1.img"], pages2) {
		t.Fatal("sender's own pages differ from what it ingested")
	}
	gotFiles := materialized(t, b, "c", 2)
	if diff := cmp.Diff(slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(gotFiles))); diff != "" {
		t.Errorf("files restored on the peer (-sender +peer):\n%s", diff)
	}
	for name, w := range want {
		if !bytes.Equal(gotFiles[name], w) {
			t.Errorf("%s restored on the peer differs from the sender's (%d bytes, want %d)", name, len(gotFiles[name]), len(w))
		}
	}
	if _, err := b.Verify(ctx, "c", 2, true, nil); err != nil {
		t.Errorf("Verify on the peer: %v", err)
	}
	// Received again, the checkpoint is returned as it is.
	if again, err := b.Receive(ctx, bytes.NewReader(delta.Bytes()), "c", 2, nil); err != nil || again.Name() != "c:2" {
		t.Errorf("second Receive = %v, %v", again, err)
	}

	t.Run("peer lacks a skipped chunk", func(t *testing.T) {
		empty := newRepo(t)
		_, err := empty.Receive(ctx, bytes.NewReader(delta.Bytes()), "c", 2, nil)
		if !errors.Is(err, image.ErrCorrupt) || !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Receive = %v, want ErrCorrupt and store.ErrNotFound", err)
		}
		if recs, _ := empty.All(); len(recs) != 0 {
			t.Fatalf("a refused stream is listed: %v", recs)
		}
	})

	// A peer with only the first checkpoint, for the damaged streams.
	peer := newRepo(t)
	if _, err := peer.Receive(ctx, bytes.NewReader(full1.Bytes()), "c", 1, nil); err != nil {
		t.Fatal(err)
	}
	refused := func(t *testing.T, what string, stream []byte) error {
		t.Helper()
		_, err := peer.Receive(ctx, bytes.NewReader(stream), "c", 2, nil)
		if !errors.Is(err, image.ErrCorrupt) {
			t.Fatalf("Receive of %s = %v, want ErrCorrupt", what, err)
		}
		if recs, _ := peer.All(); len(recs) != 1 || recs[0].Name() != "c:1" {
			t.Fatalf("Receive of %s: listed %v", what, recs)
		}
		return err
	}
	t.Run("corrupted chunk", func(t *testing.T) {
		// The last byte of the last chunk, under a valid checksum, so
		// only the chunk's ID can tell.
		body := bytes.Clone(delta.Bytes()[:delta.Len()-store.IDSize])
		body[len(body)-1] ^= 0x40
		sum := store.Hash(body)
		if err := refused(t, "a corrupted chunk", append(body, sum[:]...)); errors.Is(err, store.ErrNotFound) {
			t.Errorf("a corrupted chunk reported as missing: %v", err)
		}
	})
	t.Run("truncated", func(t *testing.T) {
		s := delta.Bytes()
		for _, n := range []int{0, 7, 8, 100, len(s) / 3, len(s) / 2, len(s) - store.IDSize, len(s) - 1} {
			refused(t, "a truncated stream", s[:n])
		}
	})
	if _, err := peer.Receive(ctx, bytes.NewReader(delta.Bytes()), "c", 2, nil); err != nil {
		t.Fatalf("Receive after the refused streams: %v", err)
	}
}

// TestChunkSourceHead: a chunk source kept open serves an image's head
// (its record and manifest, every chunk left out) with the record as it
// is listed now, and refuses once the image was taken again under the
// same name.
func TestChunkSourceHead(t *testing.T) {
	ctx := context.Background()
	a := newRepo(t)
	ingest := func(seed uint64) {
		t.Helper()
		files := map[string][]byte{"pages-1.img": seeded(seed, 64<<10), "core-1.img": seeded(seed+1, 300)}
		if err := a.Ingest(ctx, stage(t, files, tarOf(t)), &image.Record{Container: "c", Seq: 1, Config: []byte(`{}`)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	ingest(1)
	src, err := a.OpenChunkSource(ctx, "c", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	all := func(store.ID) bool { return true }
	head := func() (*image.Head, error) {
		var buf bytes.Buffer
		if err := src.ExportDelta(ctx, &buf, all); err != nil {
			return nil, err
		}
		return image.ReadHead(&buf, "c", 1)
	}
	h, err := head()
	if err != nil {
		t.Fatalf("head: %v", err)
	}
	if h.Record.Pinned || h.Record.Manifest != src.Manifest() {
		t.Fatalf("head's record: pinned %v, manifest %s; want unpinned, %s", h.Record.Pinned, h.Record.Manifest.Short(), src.Manifest().Short())
	}
	if err := a.SetPinned("c", 1, true); err != nil {
		t.Fatal(err)
	}
	if h, err = head(); err != nil || !h.Record.Pinned {
		t.Fatalf("head after pinning: %v, %v; want the pinned record", h, err)
	}
	if err := a.Remove("c", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := head(); !errors.Is(err, image.ErrNotFound) {
		t.Fatalf("head of a removed image = %v, want ErrNotFound", err)
	}
	ingest(10)
	if _, err := head(); !errors.Is(err, image.ErrNotFound) {
		t.Fatalf("head of an image taken again = %v, want ErrNotFound", err)
	}
	if err := src.ExportDelta(ctx, io.Discard, nil); err == nil {
		t.Fatal("ExportDelta without a chunk set did not fail")
	}
}

// TestStoreBeingCreated: a node's first store is being made by a writer
// (its dir is there, its config not yet) while another image arrives and
// asks what the node lacks: the store is not there yet, so it lacks
// everything, rather than failing the second image's replication with
// "read config: no such file".
func TestStoreBeingCreated(t *testing.T) {
	data := t.TempDir()
	repo := image.Repo{Dir: filepath.Join(data, "checkpoints"), StoreDir: filepath.Join(data, "store")}
	if err := os.MkdirAll(repo.StoreDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.OpenReader(); !errors.Is(err, image.ErrNotFound) {
		t.Fatalf("OpenReader of a store without its config yet: %v, want ErrNotFound", err)
	}
	ids := []store.ID{store.Hash([]byte("a")), store.Hash([]byte("b"))}
	got, err := repo.Missing(t.Context(), ids)
	if err != nil || len(got) != len(ids) {
		t.Fatalf("Missing: %v (%v), want every id", got, err)
	}
}
