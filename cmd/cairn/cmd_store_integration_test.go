package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/store"
)

// repoOf is the repo of the CLI's data dir, for tests that make
// checkpoints without containers.
func repoOf(c *cli) image.Repo {
	return image.Repo{
		Dir:         filepath.Join(c.env.DataDir, "checkpoints"),
		StoreDir:    filepath.Join(c.env.DataDir, "store"),
		Compression: store.CompressionFastest,
	}
}

// ingestFake stores a checkpoint of made-up CRIU files (seeded random
// bytes, so that each seed's chunks are its own) and a one-file fs delta.
func ingestFake(t *testing.T, repo image.Repo, name string, seq int, seed uint64) {
	t.Helper()
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, image.CRIUDir), 0o700); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	core := make([]byte, 300<<10)
	for i := range core {
		core[i] = byte(rng.Uint32())
	}
	if err := os.WriteFile(filepath.Join(src, image.CRIUDir, "core-1.img"), core, 0o600); err != nil {
		t.Fatal(err)
	}
	var delta bytes.Buffer
	tw := tar.NewWriter(&delta)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	tw.Write([]byte("abc"))
	tw.Close()
	if err := os.WriteFile(filepath.Join(src, image.DeltaName), delta.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := repo.Ingest(context.Background(), src, &image.Record{Container: name, Seq: seq, Config: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}
}

func packFiles(t *testing.T, repo image.Repo) []string {
	t.Helper()
	p, err := filepath.Glob(filepath.Join(repo.StoreDir, "packs", "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCLIVerifyReportsDamage: verify reports a record cut short, a stray
// entry in the catalog and a deleted pack as BAD lines, goes on with the
// rest, and exits 4 at the end; --json carries the same.
func TestCLIVerifyReportsDamage(t *testing.T) {
	c := newCLI(t)
	repo := repoOf(c)
	ingestFake(t, repo, "c", 1, 1)
	ingestFake(t, repo, "c", 2, 2)
	before := packFiles(t, repo)
	ingestFake(t, repo, "d", 1, 3)
	var dPacks []string
	for _, p := range packFiles(t, repo) {
		if !slices.Contains(before, p) {
			dPacks = append(dPacks, p)
		}
	}
	if len(dPacks) == 0 {
		t.Fatal("d:1 wrote no pack of its own")
	}
	if out := c.ok("verify", "--all"); strings.Count(out, "ok   ") != 4 {
		t.Fatalf("verify --all of a healthy data dir:\n%s", out)
	}

	// A record cut short is reported, not skipped.
	rec := filepath.Join(repo.Dir, "c", "2.json")
	if err := os.Truncate(rec, 20); err != nil {
		t.Fatal(err)
	}
	out, errs, code := c.run("verify", "--all")
	if code != 4 || !strings.Contains(out, "BAD  c:2: ") || !strings.Contains(out, "ok   c:1") || !strings.Contains(out, "ok   d:1") {
		t.Errorf("verify --all with a truncated record: exit %d\n%s%s", code, out, errs)
	}

	// A stray entry is reported and verify goes on.
	if err := os.Mkdir(filepath.Join(repo.Dir, "stray"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo.Dir, "c", "notes.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code = c.run("verify", "--all")
	for _, want := range []string{"BAD  catalog: stray: ", "BAD  catalog: c/notes.txt: ", "BAD  c:2: ", "ok   c:1", "ok   d:1", "ok   store:"} {
		if code != 4 || !strings.Contains(out, want) {
			t.Errorf("verify --all with stray entries: exit %d, want 4 and %q\n%s%s", code, want, out, errs)
		}
	}

	// A deleted pack is found without --read-data.
	for _, p := range dPacks {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	out, errs, code = c.run("verify", "d:1")
	if code != 4 || !strings.Contains(out, "BAD  d:1: ") || !strings.Contains(out, "missing") {
		t.Errorf("verify d:1 with its pack deleted: exit %d\n%s%s", code, out, errs)
	}
	if out := c.ok("verify", "c:1"); !strings.Contains(out, "ok   c:1") {
		t.Errorf("verify c:1: %s", out)
	}

	out, errs, code = c.run("verify", "--all", "--json")
	var rep struct {
		Checkpoints []struct {
			Checkpoint string
			OK         bool
			Error      string
		}
		Catalog []image.Stray
		Store   *image.StoreReport
		Bad     int
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("verify --all --json: %v\n%s%s", err, out, errs)
	}
	got := map[string]bool{}
	for _, r := range rep.Checkpoints {
		got[r.Checkpoint] = r.OK
	}
	if code != 4 || len(got) != 3 || !got["c:1"] || got["c:2"] || got["d:1"] {
		t.Errorf("verify --all --json: exit %d, checkpoints %+v", code, rep.Checkpoints)
	}
	var strays []string
	for _, s := range rep.Catalog {
		strays = append(strays, s.Path)
	}
	slices.Sort(strays)
	if !slices.Equal(strays, []string{"c/notes.txt", "stray"}) {
		t.Errorf("verify --all --json: catalog %+v", rep.Catalog)
	}
	if rep.Store == nil || len(rep.Store.Problems) == 0 {
		t.Errorf("verify --all --json: store %+v, want the missing pack", rep.Store)
	}
	if want := 2 + 2 + len(rep.Store.Problems); rep.Bad != want {
		t.Errorf("verify --all --json: bad %d, want %d", rep.Bad, want)
	}
}

// exportWith returns the export file of checkpoint c:1 of a new repo with
// its record edited by edit (the trailing checksum made to match), as a
// hostile sender could write it.
func exportWith(t *testing.T, edit func(rec map[string]any)) []byte {
	t.Helper()
	d := t.TempDir()
	src := image.Repo{Dir: filepath.Join(d, "cat"), StoreDir: filepath.Join(d, "store"), Compression: store.CompressionFastest}
	ingestFake(t, src, "c", 1, 7)
	var buf bytes.Buffer
	if _, err := src.Export(context.Background(), "c", 1, &buf, nil); err != nil {
		t.Fatal(err)
	}
	file := buf.Bytes()
	k := binary.LittleEndian.Uint32(file[8:])
	var rec map[string]any
	if err := json.Unmarshal(file[12:12+k], &rec); err != nil {
		t.Fatal(err)
	}
	edit(rec)
	meta, _ := json.Marshal(rec)
	out := append([]byte(nil), file[:8]...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(meta)))
	out = append(out, meta...)
	out = append(out, file[12+k:len(file)-store.IDSize]...)
	sum := store.Hash(out)
	return append(out, sum[:]...)
}

// TestCLIImportHostileNames: a container name inside an export file that
// is a path is refused with exit 4, and nothing is written outside the
// data dir or listed.
func TestCLIImportHostileNames(t *testing.T) {
	c := newCLI(t)
	dir := t.TempDir()
	var files []string
	for i, name := range []string{"../../x", "../escaped", "/abs", "a/b", "..", ""} {
		f := filepath.Join(dir, fmt.Sprintf("hostile%d.cairn", i))
		if err := os.WriteFile(f, exportWith(t, func(rec map[string]any) { rec["container"] = name }), 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	f := filepath.Join(dir, "seq.cairn")
	if err := os.WriteFile(f, exportWith(t, func(rec map[string]any) { rec["seq"] = -1 }), 0o600); err != nil {
		t.Fatal(err)
	}
	files = append(files, f)
	good := filepath.Join(dir, "good.cairn")
	if err := os.WriteFile(good, exportWith(t, func(map[string]any) {}), 0o600); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Dir(c.env.DataDir)
	before, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}

	for _, f := range files {
		_, errs, code := c.run("import", f)
		if code != 4 || !strings.Contains(errs, "corrupt") {
			t.Errorf("import of %s: exit %d %q, want 4", filepath.Base(f), code, errs)
		}
	}
	after, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("import wrote beside the data dir: %v, before %v", after, before)
	}
	if ents, _ := os.ReadDir(filepath.Join(c.env.DataDir, "checkpoints")); len(ents) != 0 {
		t.Errorf("refused imports left %d entries in the catalog", len(ents))
	}
	if _, err := os.Stat(filepath.Join(c.env.DataDir, "escaped")); err == nil {
		t.Errorf("import wrote %s", filepath.Join(c.env.DataDir, "escaped"))
	}
	// The file as it is imports.
	if out := c.ok("import", good); !strings.Contains(out, "imported c:1") {
		t.Errorf("import: %s", out)
	}
}

// TestCLIRestoreQuarantine flips one bit in a pack that no index lists (a
// crash before the index file), then restores. The store's recovery keeps
// the damaged pack in quarantine/ instead of deleting it and salvages the
// rest of it; the restore that needs the damaged chunk exits 4 naming the
// pack and what was salvaged and lost; the checkpoint that does not need
// it still restores; verify keeps reporting the quarantined pack.
func TestCLIRestoreQuarantine(t *testing.T) {
	c := newCLI(t)
	repo := repoOf(c)
	c.ok("run", "--name", "q", "--", c.bin, "stateapp", "-no-stream", "-mem", "8", "-dirty-every", "100ms", "-dir", "/var/lib/stateapp")
	c.waitLogs("q", "ready")
	c.ok("checkpoint", "q")
	before := packFiles(t, repo)
	time.Sleep(300 * time.Millisecond)
	c.ok("checkpoint", "q")
	c.ok("kill", "q")

	// A chunk only q:2 uses, in a pack only q:2 wrote.
	ctx := context.Background()
	ids1, err := repo.ChunkIDs(ctx, "q", 1)
	if err != nil {
		t.Fatal(err)
	}
	ids2, err := repo.ChunkIDs(ctx, "q", 2)
	if err != nil {
		t.Fatal(err)
	}
	st, err := repo.OpenReader()
	if err != nil {
		t.Fatal(err)
	}
	var victim, pack string
	var off int64
	for _, id := range ids2 {
		p, o, n, ok := store.Locate(st, id)
		if ok && !slices.Contains(ids1, id) && !slices.Contains(before, p) && n > 64 {
			victim, pack, off = id.String(), p, o+int64(n)/2
			break
		}
	}
	st.Close()
	if victim == "" {
		t.Fatal("q:2 has no chunk of its own in a pack of its own")
	}
	b, err := os.ReadFile(pack)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0x01
	if err := os.WriteFile(pack, b, 0o600); err != nil {
		t.Fatal(err)
	}
	idx, _ := filepath.Glob(filepath.Join(repo.StoreDir, "index", "*"))
	for _, p := range idx {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}

	packID := filepath.Base(pack)
	_, errs, code := c.run("restore", "q", "--from", "2")
	if code != 4 || !strings.Contains(errs, packID) || !strings.Contains(errs, "salvaged") || !strings.Contains(errs, "1 lost") {
		t.Errorf("restore of q:2 with a damaged unindexed pack: exit %d %q; want 4 naming pack %s and what was salvaged and lost", code, errs, packID)
	}
	if kept, err := os.ReadFile(filepath.Join(repo.StoreDir, "quarantine", packID)); err != nil || !bytes.Equal(kept, b) {
		t.Errorf("damaged pack not kept in quarantine/: %v", err)
	}
	if out := c.ok("restore", "q", "--from", "1"); !strings.Contains(out, "restored from q:1") {
		t.Errorf("restore of q:1: %s", out)
	}
	out, errs, code := c.run("verify", "--all")
	if code != 4 || !strings.Contains(out, "BAD  store: pack "+packID) || !strings.Contains(out, "ok   q:1") || !strings.Contains(out, "BAD  q:2") {
		t.Errorf("verify --all after the quarantine: exit %d\n%s%s", code, out, errs)
	}
	c.ok("rm", "-f", "q")
}
