package store_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/store"
)

// exportFixture fills a store with three manifests sharing chunks and
// exports the first two.
func exportFixture(t testing.TB) (file []byte, ids []store.ID, contents []map[string][]byte) {
	s := store.TestStore(t)
	rng := rand.New(rand.NewPCG(7, 8))
	var pool [][]byte
	for range 3 {
		f := genFiles(rng, &pool)
		id, err := putFiles(context.Background(), s, f)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		contents = append(contents, f)
	}
	var buf bytes.Buffer
	if err := s.Export(context.Background(), &buf, []store.ID{ids[0], ids[1], ids[0]}, []byte("meta"), store.ExportOptions{}); err != nil {
		t.Fatalf("Export: %v", err)
	}
	return buf.Bytes(), ids, contents
}

func TestExportImport(t *testing.T) {
	file, ids, contents := exportFixture(t)
	ctx := context.Background()
	dst := store.TestStore(t)
	var last, total int64
	got, meta, err := dst.Import(ctx, bytes.NewReader(file), store.ImportOptions{Progress: func(d, n int64) { last, total = d, n }})
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if diff := cmp.Diff(ids[:2], got); diff != "" {
		t.Errorf("imported manifests (-want +got):\n%s", diff)
	}
	if string(meta) != "meta" {
		t.Errorf("meta = %q", meta)
	}
	for i := range 2 {
		mustReadFiles(t, dst, ids[i], contents[i])
	}
	if want := len(chunksOf(t, dst, ids[0], ids[1])); dst.Stats().Chunks != want || last != total || total != int64(want) {
		t.Errorf("store has %d chunks, progress %d/%d; want %d", dst.Stats().Chunks, last, total, want)
	}
	if _, err := dst.LoadManifest(ctx, ids[2]); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("manifest not exported is there: %v", err)
	}
	// Importing again stores nothing new.
	before := dst.Stats()
	if _, _, err := dst.Import(ctx, bytes.NewReader(file), store.ImportOptions{}); err != nil {
		t.Fatalf("second Import: %v", err)
	}
	if err := dst.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if after := dst.Stats(); after != before {
		t.Errorf("second Import changed Stats from %+v to %+v", before, after)
	}
	// Export is deterministic.
	var again bytes.Buffer
	if err := dst.Export(ctx, &again, ids[:2], []byte("meta"), store.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), file) {
		t.Error("re-export differs from the imported file")
	}
}

func TestExportErrors(t *testing.T) {
	s := store.TestStore(t)
	ctx := context.Background()
	var buf bytes.Buffer
	if err := s.Export(ctx, &buf, []store.ID{store.Hash(nil)}, nil, store.ExportOptions{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Export of a missing manifest = %v, want ErrNotFound", err)
	}
	if err := s.Export(ctx, &buf, nil, make([]byte, store.MaxExportMetaSize+1), store.ExportOptions{}); err == nil {
		t.Error("Export with too much meta succeeded")
	}
}

// TestImportDamaged checks that truncated and corrupted export files give
// ErrCorrupt and leave no manifest.
func TestImportDamaged(t *testing.T) {
	file, _, _ := exportFixture(t)
	ctx := context.Background()
	dst := store.TestStore(t)
	check := func(what string, b []byte) {
		t.Helper()
		_, _, err := dst.Import(ctx, bytes.NewReader(b), store.ImportOptions{})
		if !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("Import of %s = %v, want ErrCorrupt", what, err)
		}
		if ms, err := dst.Manifests(ctx); err != nil || len(ms) != 0 {
			t.Fatalf("Import of %s left manifests %v (%v)", what, ms, err)
		}
	}
	rng := rand.New(rand.NewPCG(9, 10))
	// Every prefix near the start and end, and a sample elsewhere.
	for n := range len(file) {
		if n < 300 || n > len(file)-100 || rng.IntN(50) == 0 {
			check("truncated file", file[:n])
		}
	}
	for range 150 {
		i := rng.IntN(len(file))
		b := bytes.Clone(file)
		b[i] ^= byte(1 + rng.IntN(255))
		check("corrupted file", b)
	}
	check("file with an extra chunk", spliceExtraChunk(t, file))
	if got, _, err := dst.Import(ctx, bytes.NewReader(append(bytes.Clone(file), "trailing"...)), store.ImportOptions{}); err != nil || len(got) != 2 {
		t.Errorf("Import with trailing bytes = %v, %v; want the manifests", got, err)
	}
}

// spliceExtraChunk returns file with its chunk count raised by one and an
// unreferenced chunk record added, with a valid checksum.
func spliceExtraChunk(t *testing.T, file []byte) []byte {
	t.Helper()
	// Re-export from a store where the extra chunk would be valid is not
	// possible, so build the record by hand.
	body := bytes.Clone(file[:len(file)-store.IDSize])
	off := chunkCountOffset(t, body)
	n := uint32(body[off]) | uint32(body[off+1])<<8 | uint32(body[off+2])<<16 | uint32(body[off+3])<<24
	n++
	body[off], body[off+1], body[off+2], body[off+3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
	data := []byte("unreferenced")
	id := store.Hash(data)
	body = append(body, id[:]...)
	body = append(body, byte(len(data)), 0, 0, 0, byte(len(data)), 0, 0, 0, 0, 0, 0, 0)
	body = append(body, data...)
	sum := store.Hash(body)
	return append(body, sum[:]...)
}

// chunkCountOffset returns the offset of the chunk count in an export file.
func chunkCountOffset(t *testing.T, b []byte) int {
	t.Helper()
	u32 := func(off int) int {
		return int(uint32(b[off]) | uint32(b[off+1])<<8 | uint32(b[off+2])<<16 | uint32(b[off+3])<<24)
	}
	off := len(store.ExportMagic)
	off += 4 + u32(off)
	n := u32(off)
	off += 4
	for range n {
		off += 4 + u32(off)
	}
	return off
}

// FuzzImport feeds arbitrary bytes to Import. It must not panic; what it
// accepts must be readable; what it rejects must leave no manifest.
func FuzzImport(f *testing.F) {
	file, _, _ := exportFixture(f)
	f.Add(file)
	f.Add(file[:len(file)/2])
	f.Add([]byte(store.ExportMagic))
	var empty bytes.Buffer
	if err := store.TestStore(f).Export(context.Background(), &empty, nil, nil, store.ExportOptions{}); err != nil {
		f.Fatal(err)
	}
	f.Add(empty.Bytes())
	s := store.TestStore(f)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte) {
		before, err := s.Manifests(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids, _, err := s.Import(ctx, bytes.NewReader(data), store.ImportOptions{})
		if err != nil {
			after, _ := s.Manifests(ctx)
			if !cmp.Equal(before, after) {
				t.Fatalf("failed Import (%v) changed the manifests from %v to %v", err, before, after)
			}
			return
		}
		for _, id := range ids {
			if _, err := readFiles(ctx, s, id); err != nil {
				t.Fatalf("imported manifest %s: %v", id.Short(), err)
			}
		}
	})
}

// deltaFixture puts a base set of files and an edited copy of it (two
// blocks of one file replaced, the other file unchanged) into src, gives
// dst the base through a self-contained export, and returns a delta
// stream of the edited copy against dst's chunks. The stream's records
// are thus surrounded by skipped chunks, before, between and after them.
func deltaFixture(t testing.TB) (src, dst *store.Store, base, edited store.ID, want map[string][]byte, delta []byte) {
	t.Helper()
	ctx := context.Background()
	src, dst = store.TestStore(t), store.TestStore(t)
	files := map[string][]byte{"a": randBytes(1, 16*testChunkSize), "z": compressible(2, 5*testChunkSize)}
	var err error
	if base, err = putFiles(ctx, src, files); err != nil {
		t.Fatal(err)
	}
	want = map[string][]byte{"a": bytes.Clone(files["a"]), "z": files["z"]}
	copy(want["a"][3*testChunkSize:], randBytes(3, testChunkSize))
	copy(want["a"][9*testChunkSize:], randBytes(4, testChunkSize))
	if edited, err = putFiles(ctx, src, want); err != nil {
		t.Fatal(err)
	}
	var full bytes.Buffer
	if err := src.Export(ctx, &full, []store.ID{base}, nil, store.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := dst.Import(ctx, &full, store.ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := src.Export(ctx, &buf, []store.ID{edited}, []byte("meta"), store.ExportOptions{Skip: dst.Has}); err != nil {
		t.Fatalf("delta Export: %v", err)
	}
	return src, dst, base, edited, want, buf.Bytes()
}

func TestExportDelta(t *testing.T) {
	src, dst, base, edited, want, delta := deltaFixture(t)
	ctx := context.Background()
	if !bytes.HasPrefix(delta, []byte(store.DeltaExportMagic)) {
		t.Fatalf("delta stream starts with %q", delta[:8])
	}
	var full bytes.Buffer
	if err := src.Export(ctx, &full, []store.ID{edited}, []byte("meta"), store.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	// Two new 4 KiB chunks, random so stored as they are, and the manifest.
	if len(delta) > 3*testChunkSize || len(delta) > full.Len()/4 {
		t.Errorf("delta stream is %d bytes, the full one %d", len(delta), full.Len())
	}

	// A plain import refuses it, clearly and without calling it damage.
	_, _, err := dst.Import(ctx, bytes.NewReader(delta), store.ImportOptions{})
	if !errors.Is(err, store.ErrDeltaExport) || errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("plain Import of a delta stream = %v, want ErrDeltaExport", err)
	}
	if ms, _ := dst.Manifests(ctx); !cmp.Equal(ms, []store.ID{base}) {
		t.Fatalf("refused Import left manifests %v", ms)
	}

	before := dst.Stats()
	var last, total int64
	got, meta, err := dst.Import(ctx, bytes.NewReader(delta), store.ImportOptions{AllowDelta: true, Progress: func(d, n int64) { last, total = d, n }})
	if err != nil {
		t.Fatalf("delta Import: %v", err)
	}
	if !cmp.Equal(got, []store.ID{edited}) || string(meta) != "meta" {
		t.Errorf("delta Import = %v, %q", got, meta)
	}
	mustReadFiles(t, dst, edited, want)
	mustReadFiles(t, dst, base, map[string][]byte{"a": randBytes(1, 16*testChunkSize), "z": compressible(2, 5*testChunkSize)})
	if added := dst.Stats().Chunks - before.Chunks; added != 2 || last != 2 || total != 2 {
		t.Errorf("delta Import added %d chunks, progress %d/%d; want 2", added, last, total)
	}

	// A store that lacks the skipped chunks refuses the stream.
	empty := store.TestStore(t)
	_, _, err = empty.Import(ctx, bytes.NewReader(delta), store.ImportOptions{AllowDelta: true})
	if !errors.Is(err, store.ErrCorrupt) || !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delta Import into an empty store = %v, want ErrCorrupt and ErrNotFound", err)
	}
	if ms, _ := empty.Manifests(ctx); len(ms) != 0 {
		t.Fatalf("refused delta Import left manifests %v", ms)
	}

	// AllowDelta takes self-contained files too.
	if got, _, err := empty.Import(ctx, bytes.NewReader(full.Bytes()), store.ImportOptions{AllowDelta: true}); err != nil || !cmp.Equal(got, []store.ID{edited}) {
		t.Fatalf("Import of a full file with AllowDelta = %v, %v", got, err)
	}
	mustReadFiles(t, empty, edited, want)

	// Skipping nothing still makes a delta stream, one that stands alone.
	var all bytes.Buffer
	if err := src.Export(ctx, &all, []store.ID{edited}, nil, store.ExportOptions{Skip: func(store.ID) bool { return false }}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.TestStore(t).Import(ctx, &all, store.ImportOptions{AllowDelta: true}); err != nil {
		t.Fatalf("Import of a delta stream that skips nothing: %v", err)
	}
}

// TestExportManifests: manifests loaded already export to the same bytes
// as by their IDs, whole, as a delta and as a head (every chunk skipped).
func TestExportManifests(t *testing.T) {
	src, dst, base, edited, _, delta := deltaFixture(t)
	ctx := context.Background()
	var ms []*store.Manifest
	for _, id := range []store.ID{edited, base} {
		m, err := src.LoadManifest(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	export := func(opts store.ExportOptions, meta string, ms ...*store.Manifest) []byte {
		t.Helper()
		var buf bytes.Buffer
		if err := src.ExportManifests(ctx, &buf, ms, []byte(meta), opts); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	if got := export(store.ExportOptions{Skip: dst.Has}, "meta", ms[0]); !bytes.Equal(got, delta) {
		t.Errorf("delta from the loaded manifest: %d bytes unlike Export's %d", len(got), len(delta))
	}
	for _, opts := range []store.ExportOptions{{}, {Skip: func(store.ID) bool { return true }}} {
		var want bytes.Buffer
		if err := src.Export(ctx, &want, []store.ID{edited, base}, nil, opts); err != nil {
			t.Fatal(err)
		}
		if got := export(opts, "", ms...); !bytes.Equal(got, want.Bytes()) {
			t.Errorf("skip %v: %d bytes from the loaded manifests unlike Export's %d", opts.Skip != nil, len(got), want.Len())
		}
	}
}

// TestImportDeltaDamaged checks that truncated, corrupted and reordered
// delta streams give ErrCorrupt and leave no manifest.
func TestImportDeltaDamaged(t *testing.T) {
	_, dst, base, _, _, delta := deltaFixture(t)
	ctx := context.Background()
	check := func(what string, b []byte) error {
		t.Helper()
		_, _, err := dst.Import(ctx, bytes.NewReader(b), store.ImportOptions{AllowDelta: true})
		if !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("Import of %s = %v, want ErrCorrupt", what, err)
		}
		if ms, _ := dst.Manifests(ctx); !cmp.Equal(ms, []store.ID{base}) {
			t.Fatalf("Import of %s left manifests %v", what, ms)
		}
		return err
	}
	for n := range len(delta) {
		check("truncated stream", delta[:n])
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for range 150 {
		b := bytes.Clone(delta)
		b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
		check("corrupted stream", b)
	}
	// Damage inside a chunk, under a valid trailing checksum: only the
	// chunk's ID can catch it, and it is damage, not a missing chunk.
	b := bytes.Clone(delta[:len(delta)-store.IDSize])
	b[len(b)-1] ^= 1
	sum := store.Hash(b)
	if err := check("stream with a damaged chunk", append(b, sum[:]...)); errors.Is(err, store.ErrNotFound) {
		t.Errorf("damaged chunk reported as missing: %v", err)
	}
	check("stream with its chunks swapped", swapChunks(t, delta))
}

// swapChunks returns a stream of two chunk records with the records
// swapped and a valid checksum.
func swapChunks(t *testing.T, file []byte) []byte {
	t.Helper()
	body := file[:len(file)-store.IDSize]
	off := chunkCountOffset(t, body) + 4
	const hdr = store.IDSize + 12
	size := func(off int) int {
		return hdr + int(uint32(body[off+32])|uint32(body[off+33])<<8|uint32(body[off+34])<<16|uint32(body[off+35])<<24)
	}
	first := body[off : off+size(off)]
	second := body[off+len(first):]
	if len(second) != size(off+len(first)) {
		t.Fatalf("stream does not hold exactly two chunks")
	}
	out := append(bytes.Clone(body[:off]), second...)
	out = append(out, first...)
	sum := store.Hash(out)
	return append(out, sum[:]...)
}

// FuzzImportDelta feeds arbitrary bytes to Import with AllowDelta into a
// store that holds the base of the seed stream. It must not panic; what it
// accepts must be readable; what it rejects must leave no manifest.
func FuzzImportDelta(f *testing.F) {
	src, s, _, edited, _, delta := deltaFixture(f)
	ctx := context.Background()
	f.Add(delta)
	f.Add(delta[:len(delta)/2])
	f.Add([]byte(store.DeltaExportMagic))
	var buf bytes.Buffer
	if err := src.Export(ctx, &buf, []store.ID{edited}, nil, store.ExportOptions{Skip: func(store.ID) bool { return true }}); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		before, err := s.Manifests(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids, _, err := s.Import(ctx, bytes.NewReader(data), store.ImportOptions{AllowDelta: true})
		if err != nil {
			after, _ := s.Manifests(ctx)
			if !cmp.Equal(before, after) {
				t.Fatalf("failed Import (%v) changed the manifests from %v to %v", err, before, after)
			}
			return
		}
		for _, id := range ids {
			if _, err := readFiles(ctx, s, id); err != nil {
				t.Fatalf("imported manifest %s: %v", id.Short(), err)
			}
		}
	})
}
