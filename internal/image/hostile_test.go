package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/store"
)

// dataRepo returns a repo whose catalog and store are in DIR/data, and
// DIR: a test can check that nothing appears in DIR beside data.
func dataRepo(t testing.TB) (image.Repo, string) {
	d := t.TempDir()
	data := filepath.Join(d, "data")
	return image.Repo{Dir: filepath.Join(data, "checkpoints"), StoreDir: filepath.Join(data, "store"), Compression: store.CompressionFastest}, d
}

// onlyData fails the test if anything but data/ is in dir, or if the
// catalog holds anything.
func onlyData(t testing.TB, dir string, repo image.Repo) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var top []string
	for _, e := range ents {
		top = append(top, e.Name())
	}
	if len(top) > 0 && !slices.Equal(top, []string{"data"}) {
		t.Fatalf("written outside the data dir: %v", top)
	}
	if ents, _ := os.ReadDir(repo.Dir); len(ents) != 0 {
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
		}
		t.Fatalf("the catalog holds %v after a refused stream", got)
	}
}

// exportFile ingests a small image as c:1 in a new repo and returns its
// export file.
func exportFile(t testing.TB) []byte {
	t.Helper()
	ctx := context.Background()
	src := newRepo(t)
	delta := tarOf(t, &tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}, &tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	if err := src.Ingest(ctx, stage(t, map[string][]byte{"core-1.img": []byte("core"), "pages-1.img": seeded(9, 4096)}, delta), &image.Record{Container: "c", Seq: 1, Config: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := src.Export(ctx, "c", 1, &buf, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// withRecord rewrites the record (the meta) of an export file and its
// trailing checksum, as a hostile sender could.
func withRecord(t testing.TB, file []byte, edit func(rec map[string]any)) []byte {
	t.Helper()
	k := binary.LittleEndian.Uint32(file[8:])
	var rec map[string]any
	if err := json.Unmarshal(file[12:12+k], &rec); err != nil {
		t.Fatal(err)
	}
	edit(rec)
	meta, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	out = append(out, file[:8]...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(meta)))
	out = append(out, meta...)
	out = append(out, file[12+k:len(file)-store.IDSize]...)
	sum := store.Hash(out)
	return append(out, sum[:]...)
}

var hostileNames = []string{"../../x", "../x", "/abs", "a/b", "", ".", "..", "x\x00y", "x\ny", string(bytes.Repeat([]byte("n"), 64))}

// TestImportRefusesHostileNames: a container name or checkpoint number
// from inside an export file that is no valid name is refused as corrupt
// before any path is made of it, and nothing is written outside the data
// dir or listed.
func TestImportRefusesHostileNames(t *testing.T) {
	ctx := context.Background()
	file := exportFile(t)
	for _, name := range hostileNames {
		t.Run("import "+name, func(t *testing.T) {
			repo, dir := dataRepo(t)
			bad := withRecord(t, file, func(rec map[string]any) { rec["container"] = name })
			_, err := repo.Import(ctx, bytes.NewReader(bad), "", nil)
			if !errors.Is(err, image.ErrCorrupt) {
				t.Fatalf("Import = %v, want ErrCorrupt", err)
			}
			onlyData(t, dir, repo)
		})
		t.Run("receive "+name, func(t *testing.T) {
			repo, dir := dataRepo(t)
			bad := withRecord(t, file, func(rec map[string]any) { rec["container"] = name })
			_, err := repo.Receive(ctx, bytes.NewReader(bad), "c", 1, nil)
			if !errors.Is(err, image.ErrCorrupt) {
				t.Fatalf("Receive = %v, want ErrCorrupt", err)
			}
			onlyData(t, dir, repo)
		})
		t.Run("asked for "+name, func(t *testing.T) {
			repo, dir := dataRepo(t)
			bad := withRecord(t, file, func(rec map[string]any) { rec["container"] = name })
			if _, err := repo.Receive(ctx, bytes.NewReader(bad), name, 1, nil); !errors.Is(err, names.ErrInvalid) {
				t.Fatalf("Receive = %v, want names.ErrInvalid", err)
			}
			if name != "" {
				if _, err := repo.Import(ctx, bytes.NewReader(file), name, nil); !errors.Is(err, names.ErrInvalid) {
					t.Fatalf("Import as %q = %v, want names.ErrInvalid", name, err)
				}
			}
			onlyData(t, dir, repo)
		})
	}
	for _, seq := range []int{0, -1, -100} {
		t.Run("receive seq", func(t *testing.T) {
			repo, dir := dataRepo(t)
			bad := withRecord(t, file, func(rec map[string]any) { rec["seq"] = seq })
			if _, err := repo.Receive(ctx, bytes.NewReader(bad), "c", 1, nil); !errors.Is(err, image.ErrCorrupt) {
				t.Fatalf("Receive of seq %d = %v, want ErrCorrupt", seq, err)
			}
			if _, err := repo.Import(ctx, bytes.NewReader(bad), "", nil); !errors.Is(err, image.ErrCorrupt) {
				t.Fatalf("Import of seq %d = %v, want ErrCorrupt", seq, err)
			}
			onlyData(t, dir, repo)
		})
	}
	// A peer must send what it was asked for.
	for _, want := range []struct {
		container string
		seq       int
	}{{"d", 1}, {"c", 2}} {
		t.Run("receive other than asked", func(t *testing.T) {
			repo, dir := dataRepo(t)
			if _, err := repo.Receive(ctx, bytes.NewReader(file), want.container, want.seq, nil); !errors.Is(err, image.ErrCorrupt) {
				t.Fatalf("Receive of c:1 asked as %s:%d = %v, want ErrCorrupt", want.container, want.seq, err)
			}
			onlyData(t, dir, repo)
			if st, err := repo.OpenReader(); err == nil {
				if n := st.Stats().Chunks; n != 0 {
					t.Errorf("a refused stream stored %d chunks", n)
				}
				st.Close()
			}
		})
	}
	// The file as it is imports, under its own name and under another.
	repo, _ := dataRepo(t)
	if rec, err := repo.Import(ctx, bytes.NewReader(file), "", nil); err != nil || rec.Name() != "c:1" {
		t.Fatalf("Import = %v, %v", rec, err)
	}
	if rec, err := repo.Import(ctx, bytes.NewReader(file), "other", nil); err != nil || rec.Name() != "other:1" {
		t.Fatalf("Import as other = %v, %v", rec, err)
	}
}

// shapedExport lists a hand-made manifest as checkpoint c:1 of a new repo
// and returns its export file.
func shapedExport(t *testing.T, nodes []store.Node) []byte {
	t.Helper()
	src := newRepo(t)
	rec := putRecord(t, src, nodes)
	rec.Version, rec.Config = image.RecordVersion, json.RawMessage(`{}`)
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(src.Dir, "c"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src.Dir, "c", "1.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := src.Export(context.Background(), "c", 1, &buf, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestImportRefusesBadShape: import and receive refuse, as corrupt, an
// image that restore would refuse, before anything of it is listed.
func TestImportRefusesBadShape(t *testing.T) {
	criu := store.Node{Path: image.CRIUDir, Kind: store.KindDir, Mode: 0o700}
	core := store.Node{Path: "criu/core-1.img", Kind: store.KindFile, Mode: 0o600, Size: 4}
	fsd := store.Node{Path: image.FSDir, Kind: store.KindDir, Mode: 0o755}
	tests := []struct {
		name  string
		nodes []store.Node
	}{
		{"char device", []store.Node{criu, core, fsd, {Path: "fs/null", Kind: store.KindCharDev, Major: 1, Minor: 3}}},
		{"block device", []store.Node{criu, core, fsd, {Path: "fs/sda", Kind: store.KindBlockDev, Major: 8}}},
		{"symlink in criu", []store.Node{criu, core, {Path: "criu/pages-1.img", Kind: store.KindSymlink, Target: "/etc/shadow"}, fsd}},
		{"dir in criu", []store.Node{criu, core, {Path: "criu/sub", Kind: store.KindDir}, {Path: "criu/sub/x", Kind: store.KindFile, Size: 2}, fsd}},
		{"fifo in criu", []store.Node{criu, core, {Path: "criu/p", Kind: store.KindFIFO}, fsd}},
		{"outside criu and fs", []store.Node{criu, core, {Path: "etc", Kind: store.KindDir}, fsd}},
		{"criu not a dir", []store.Node{{Path: image.CRIUDir, Kind: store.KindFile, Size: 1}, fsd}},
		{"no criu files", []store.Node{criu, fsd, {Path: "fs/f", Kind: store.KindFile, Size: 3}}},
		{"nothing", []store.Node{}},
		{"through symlink", []store.Node{criu, core, fsd, {Path: "fs/s", Kind: store.KindSymlink, Target: "/"}, {Path: "fs/s/escaped", Kind: store.KindFile, Size: 3}}},
		{"missing parent", []store.Node{criu, core, fsd, {Path: "fs/no/such/x", Kind: store.KindFile, Size: 3}}},
	}
	ctx := context.Background()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := shapedExport(t, tc.nodes)
			repo, dir := dataRepo(t)
			if _, err := repo.Import(ctx, bytes.NewReader(file), "", nil); !errors.Is(err, image.ErrCorrupt) {
				t.Errorf("Import = %v, want ErrCorrupt", err)
			}
			onlyData(t, dir, repo)
			if _, err := repo.Receive(ctx, bytes.NewReader(file), "c", 1, nil); !errors.Is(err, image.ErrCorrupt) {
				t.Errorf("Receive = %v, want ErrCorrupt", err)
			}
			onlyData(t, dir, repo)
		})
	}
	// The same shapes, well formed, are accepted: whiteouts, FIFOs,
	// socket files, symlinks and nested dirs in fs/.
	good := []store.Node{criu, core, fsd,
		{Path: "fs/a", Kind: store.KindDir, Mode: 0o755},
		{Path: "fs/a/f", Kind: store.KindFile, Size: 3},
		{Path: "fs/a/l", Kind: store.KindSymlink, Target: "../../../etc/passwd"},
		{Path: "fs/p", Kind: store.KindFIFO},
		{Path: "fs/s", Kind: store.KindSocket, Mode: 0o755},
		{Path: "fs/w", Kind: store.KindWhiteout},
	}
	repo, _ := dataRepo(t)
	if rec, err := repo.Import(ctx, bytes.NewReader(shapedExport(t, good)), "", nil); err != nil || rec.Name() != "c:1" {
		t.Fatalf("Import of a well-formed image = %v, %v", rec, err)
	}
}

// TestMaterializeAfterQuarantine: a bit flipped in a pack that no index
// lists (a crash before the index file was written) costs only the damaged
// blob. The restore's recovery moves the pack to quarantine/ rather than
// deleting it, salvages the other blobs, and a checkpoint whose chunks
// are all among them still materializes; one that needs the damaged blob
// is refused as corrupt.
func TestMaterializeAfterQuarantine(t *testing.T) {
	ctx := context.Background()
	repo := newRepo(t)
	core := seeded(21, 40000)
	pages := seeded(22, 16*4096)
	delta := tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	r1 := &image.Record{Container: "c", Seq: 1, Config: []byte(`{}`)}
	if err := repo.Ingest(ctx, stage(t, map[string][]byte{"core-1.img": core, "pages-1.img": pages}, delta), r1, nil); err != nil {
		t.Fatal(err)
	}
	// c:2 uses a subset of c:1's chunks: it added nothing to the store.
	r2 := &image.Record{Container: "c", Seq: 2, Config: []byte(`{}`)}
	if err := repo.Ingest(ctx, stage(t, map[string][]byte{"core-1.img": core}, delta), r2, nil); err != nil {
		t.Fatal(err)
	}
	if r2.NewChunks != 0 {
		t.Fatalf("c:2 wrote %d chunks, want none", r2.NewChunks)
	}
	packs, _ := filepath.Glob(filepath.Join(repo.StoreDir, "packs", "*", "*"))
	if len(packs) != 1 {
		t.Fatalf("packs %v, want 1", packs)
	}
	idx, _ := filepath.Glob(filepath.Join(repo.StoreDir, "index", "*"))
	for _, p := range idx {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	// The first page of pages-1.img: c:1 needs it, c:2 does not.
	st, err := repo.OpenReader()
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	b, err := os.ReadFile(packs[0])
	if err != nil {
		t.Fatal(err)
	}
	page := seeded(22, 4096)
	off := bytes.Index(b, page)
	if off < 0 {
		t.Fatal("first page not stored as it is")
	}
	b[off+100] ^= 0x04
	if err := os.WriteFile(packs[0], b, 0o600); err != nil {
		t.Fatal(err)
	}

	got := materialized(t, repo, "c", 2)
	if !bytes.Equal(got["criu/core-1.img"], core) || string(got["fs/f"]) != "xxx" {
		t.Fatalf("c:2 materialized as %d bytes of core, fs/f %q", len(got["criu/core-1.img"]), got["fs/f"])
	}
	q := filepath.Join(repo.StoreDir, "quarantine", filepath.Base(packs[0]))
	if kept, err := os.ReadFile(q); err != nil || !bytes.Equal(kept, b) {
		t.Fatalf("damaged pack not kept in quarantine: %v", err)
	}
	if err := repo.Materialize(ctx, r1, t.TempDir(), t.TempDir(), nil); !errors.Is(err, image.ErrCorrupt) {
		t.Fatalf("Materialize of c:1 = %v, want ErrCorrupt", err)
	}
}

// TestRepoRefusesBadRefs: the repo itself refuses names and numbers that
// would make paths outside its dir, whoever calls it.
func TestRepoRefusesBadRefs(t *testing.T) {
	dir := t.TempDir()
	r := image.Repo{Dir: filepath.Join(dir, "checkpoints"), StoreDir: filepath.Join(dir, "store")}
	for _, ref := range []struct {
		name string
		seq  int
	}{{"../x", 1}, {"/abs", 1}, {"a/b", 1}, {"..", 1}, {"ok", 0}, {"ok", -3}} {
		if _, err := r.Load(ref.name, ref.seq); !errors.Is(err, names.ErrInvalid) {
			t.Errorf("Load(%q, %d): %v, want names.ErrInvalid", ref.name, ref.seq, err)
		}
		if err := r.Remove(ref.name, ref.seq); !errors.Is(err, names.ErrInvalid) {
			t.Errorf("Remove(%q, %d): %v, want names.ErrInvalid", ref.name, ref.seq, err)
		}
		if err := r.SetPinned(ref.name, ref.seq, true); !errors.Is(err, names.ErrInvalid) {
			t.Errorf("SetPinned(%q, %d): %v, want names.ErrInvalid", ref.name, ref.seq, err)
		}
		if ref.seq == 1 {
			if _, errs := r.List(ref.name); len(errs) != 1 || !errors.Is(errs[0], names.ErrInvalid) {
				t.Errorf("List(%q): %v, want names.ErrInvalid", ref.name, errs)
			}
			if _, err := r.Latest(ref.name); !errors.Is(err, names.ErrInvalid) {
				t.Errorf("Latest(%q): %v, want names.ErrInvalid", ref.name, err)
			}
		}
	}
}

// TestImportChecksConfig: a record whose container config the repo's
// CheckConfig refuses (container.CheckRecordedConfig on a node: a volume
// of the host's root, say) is refused as corrupt by import and receive
// before any of it is stored.
func TestImportChecksConfig(t *testing.T) {
	ctx := context.Background()
	bad := withRecord(t, exportFile(t), func(rec map[string]any) {
		rec["config"] = map[string]any{"volumes": []any{map[string]any{"host": "/", "path": "/host"}}}
	})
	refuse := func(raw json.RawMessage) error {
		if bytes.Contains(raw, []byte(`"host":"/"`)) {
			return errors.New("the host's root as a volume")
		}
		return nil
	}
	repo, dir := dataRepo(t)
	repo.CheckConfig = refuse
	if _, err := repo.Import(ctx, bytes.NewReader(bad), "", nil); !errors.Is(err, image.ErrCorrupt) || !strings.Contains(err.Error(), "host's root") {
		t.Fatalf("Import = %v, want ErrCorrupt naming the config", err)
	}
	onlyData(t, dir, repo)
	if _, err := repo.Receive(ctx, bytes.NewReader(bad), "c", 1, nil); !errors.Is(err, image.ErrCorrupt) {
		t.Fatalf("Receive = %v, want ErrCorrupt", err)
	}
	onlyData(t, dir, repo)
	// The same file with a config that grants nothing is taken.
	good := withRecord(t, exportFile(t), func(rec map[string]any) { rec["config"] = map[string]any{} })
	if _, err := repo.Import(ctx, bytes.NewReader(good), "", nil); err != nil {
		t.Fatal(err)
	}
}
