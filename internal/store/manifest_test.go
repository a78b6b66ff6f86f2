package store_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/cairn-hpc/cairn/internal/store"
)

var mtime = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC)

// testManifest returns a manifest with one node of every kind, in canonical
// order, whose file chunks are chunks (as put by the caller).
func testManifest(chunks ...[]byte) *store.Manifest {
	var ids []store.ID
	var size uint64
	for _, c := range chunks {
		ids = append(ids, store.Hash(c))
		size += uint64(len(c))
	}
	return &store.Manifest{
		Labels: map[string]string{"criu": "4.2", "rank": "3"},
		Nodes: []store.Node{
			{Path: ".", Kind: store.KindDir, Mode: 0o755, MTime: mtime},
			{Path: "dev", Kind: store.KindDir, Mode: 0o755, MTime: mtime,
				Xattrs: []store.Xattr{{Name: "trusted.overlay.opaque", Value: []byte("y")}}},
			{Path: "dev/null", Kind: store.KindCharDev, Mode: 0o666, Major: 1, Minor: 3, MTime: mtime},
			{Path: "dev/sda", Kind: store.KindBlockDev, Mode: 0o660, GID: 6, Major: 8, MTime: mtime},
			{Path: "etc/gone", Kind: store.KindWhiteout, MTime: mtime},
			{Path: "pages-1.img", Kind: store.KindFile, Mode: 0o600, UID: 1000, GID: 1000, MTime: mtime,
				Size: size, Chunks: ids,
				Xattrs: []store.Xattr{{Name: "security.capability", Value: []byte{1, 2, 3}}, {Name: "user.empty", Value: []byte{}}}},
			{Path: "run/fifo", Kind: store.KindFIFO, Mode: 0o644, MTime: mtime},
			{Path: "run/sock", Kind: store.KindSocket, Mode: 0o777, MTime: time.Unix(-1, 5).UTC()},
			{Path: "usr/bin/sh", Kind: store.KindSymlink, Mode: 0o777, Target: "../../bin/busybox", MTime: mtime},
			{Path: "zero", Kind: store.KindFile, Mode: 0o4755},
		},
	}
}

var manifestOpts = cmp.Options{cmpopts.EquateEmpty()}

func TestManifestRoundTrip(t *testing.T) {
	m := testManifest([]byte("a"), []byte("bc"))
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got store.Manifest
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(m, &got, manifestOpts); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if ids := got.ChunkIDs(); len(ids) != 2 {
		t.Errorf("ChunkIDs = %v", ids)
	}
}

// TestManifestLayout pins the encoding of a manifest: a change to it changes
// every manifest's ID, and needs a new format version (docs/format.md).
func TestManifestLayout(t *testing.T) {
	b, err := testManifest([]byte("a"), []byte("bc")).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	const want = "a311acbf5a7698e7908d52bb896ade250df7e0f88df66163c01e8bdd92c580d4"
	if got := store.Hash(b).String(); got != want {
		t.Errorf("manifest ID = %s, want %s (%d bytes)", got, want, len(b))
	}
	m := &store.Manifest{Nodes: []store.Node{{Path: "f", Kind: store.KindFile, Mode: 0o644, Size: 1,
		Chunks: []store.ID{{0xab}}, MTime: time.Unix(1, 2)}}}
	b, err = m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	// magic, 0 labels, 1 node: path "f", kind 1, mode, uid, gid, mtime
	// seconds and nanoseconds, size, 1 chunk, empty target, major,
	// minor, 0 xattrs; then the checksum.
	wantBody := "434149524e4d4601" + "00000000" + "01000000" +
		"01000000" + "66" + "01" + "a4010000" + "00000000" + "00000000" +
		"0100000000000000" + "02000000" + "0100000000000000" +
		"01000000" + "ab00000000000000000000000000000000000000000000000000000000000000" +
		"00000000" + "00000000" + "00000000" + "00000000"
	if got := cmp.Diff(wantBody, hexString(b[:len(b)-32])); got != "" {
		t.Errorf("encoding (-want +got):\n%s", got)
	}
}

func TestManifestIsCanonical(t *testing.T) {
	m := testManifest([]byte("x"))
	want, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for range 5 {
		rng.Shuffle(len(m.Nodes), func(i, j int) { m.Nodes[i], m.Nodes[j] = m.Nodes[j], m.Nodes[i] })
		for _, n := range m.Nodes {
			rng.Shuffle(len(n.Xattrs), func(i, j int) { n.Xattrs[i], n.Xattrs[j] = n.Xattrs[j], n.Xattrs[i] })
		}
		got, err := m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatal("encoding depends on the order of nodes or xattrs")
		}
	}
}

func TestManifestInvalid(t *testing.T) {
	tests := []struct {
		name string
		node store.Node
	}{
		{"empty path", store.Node{Kind: store.KindDir}},
		{"absolute path", store.Node{Path: "/etc", Kind: store.KindDir}},
		{"unclean path", store.Node{Path: "a//b", Kind: store.KindDir}},
		{"trailing slash", store.Node{Path: "a/", Kind: store.KindDir}},
		{"dot dot", store.Node{Path: "..", Kind: store.KindDir}},
		{"escaping path", store.Node{Path: "../etc/passwd", Kind: store.KindFile}},
		{"NUL in path", store.Node{Path: "a\x00b", Kind: store.KindDir}},
		{"long path", store.Node{Path: string(make([]byte, store.MaxPathLen+1)), Kind: store.KindDir}},
		{"unknown kind", store.Node{Path: "a", Kind: 9}},
		{"zero kind", store.Node{Path: "a"}},
		{"mode type bits", store.Node{Path: "a", Kind: store.KindFile, Mode: 0o100644}},
		{"dir with chunks", store.Node{Path: "a", Kind: store.KindDir, Chunks: []store.ID{{1}}}},
		{"symlink with size", store.Node{Path: "a", Kind: store.KindSymlink, Target: "b", Size: 1}},
		{"symlink without target", store.Node{Path: "a", Kind: store.KindSymlink}},
		{"file with target", store.Node{Path: "a", Kind: store.KindFile, Target: "b"}},
		{"file with device", store.Node{Path: "a", Kind: store.KindFile, Major: 1}},
		{"chardev 0:0", store.Node{Path: "a", Kind: store.KindCharDev}},
		{"whiteout with device", store.Node{Path: "a", Kind: store.KindWhiteout, Minor: 1}},
		{"empty xattr name", store.Node{Path: "a", Kind: store.KindDir, Xattrs: []store.Xattr{{}}}},
		{"duplicate xattr", store.Node{Path: "a", Kind: store.KindDir,
			Xattrs: []store.Xattr{{Name: "user.x"}, {Name: "user.x"}}}},
		{"huge xattr", store.Node{Path: "a", Kind: store.KindDir,
			Xattrs: []store.Xattr{{Name: "user.x", Value: make([]byte, store.MaxXattrValueLen+1)}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &store.Manifest{Nodes: []store.Node{tc.node}}
			if _, err := m.MarshalBinary(); !errors.Is(err, store.ErrInvalidManifest) {
				t.Errorf("MarshalBinary = %v, want ErrInvalidManifest", err)
			}
		})
	}
	dup := &store.Manifest{Nodes: []store.Node{{Path: "a", Kind: store.KindDir}, {Path: "a", Kind: store.KindFIFO}}}
	if _, err := dup.MarshalBinary(); !errors.Is(err, store.ErrInvalidManifest) {
		t.Errorf("duplicate paths: MarshalBinary = %v, want ErrInvalidManifest", err)
	}
	label := &store.Manifest{Labels: map[string]string{"": "x"}}
	if _, err := label.MarshalBinary(); !errors.Is(err, store.ErrInvalidManifest) {
		t.Errorf("empty label: MarshalBinary = %v, want ErrInvalidManifest", err)
	}
}

func TestManifestUnmarshalRejects(t *testing.T) {
	good, err := testManifest([]byte("a")).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"empty":         nil,
		"truncated":     good[:len(good)-1],
		"trailing byte": append(append([]byte(nil), good...), 0),
		"bad checksum":  append(append([]byte(nil), good[:len(good)-1]...), good[len(good)-1]^1),
		"bad magic":     reseal(append([]byte("X"), good[1:]...)),
		"trailing body": reseal(append(append([]byte(nil), good[:len(good)-32]...), 0)),
	} {
		var m store.Manifest
		if err := m.UnmarshalBinary(b); !errors.Is(err, store.ErrInvalidManifest) {
			t.Errorf("%s: UnmarshalBinary = %v, want ErrInvalidManifest", name, err)
		}
	}
}

// reseal replaces the trailing checksum of an encoded manifest.
func reseal(b []byte) []byte {
	body := b[:len(b)-32]
	sum := store.Hash(body)
	return append(append([]byte(nil), body...), sum[:]...)
}

func TestPutLoadManifest(t *testing.T) {
	s := store.TestStore(t)
	ctx := context.Background()
	c1, c2 := randBytes(1, 70000), compressible(2, 50000)
	mustPut(t, s, c1)
	mustPut(t, s, c2)
	m := testManifest(c1, c2, c1)
	id, err := s.PutManifest(ctx, m)
	if err != nil {
		t.Fatalf("PutManifest: %v", err)
	}
	got, err := s.LoadManifest(ctx, id)
	if err != nil {
		t.Fatalf("LoadManifest: %v", err)
	}
	if diff := cmp.Diff(m, got, manifestOpts); diff != "" {
		t.Errorf("loaded manifest (-put +loaded):\n%s", diff)
	}
	if id2, err := s.PutManifest(ctx, m); err != nil || id2 != id {
		t.Errorf("second PutManifest = %s, %v; want %s", id2, err, id)
	}
	ids, err := s.Manifests(ctx)
	if err != nil || len(ids) != 1 || ids[0] != id {
		t.Errorf("Manifests = %v, %v; want [%s]", ids, err, id)
	}

	if _, err := s.LoadManifest(ctx, store.Hash([]byte("nothing"))); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("LoadManifest of an unknown id = %v, want ErrNotFound", err)
	}

	flipByte(t, filepath.Join(s.Dir(), "manifests", id.String()), 30)
	_, err = s.LoadManifest(ctx, id)
	var ce *store.CorruptError
	if !errors.As(err, &ce) || ce.ID != id || !ce.Pack.IsNull() || !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("LoadManifest of a damaged manifest = %v, want a *CorruptError for %s", err, id)
	}
}

func TestPutManifestRefusesMissingChunks(t *testing.T) {
	s := store.TestStore(t)
	ctx := context.Background()
	present, missing := randBytes(1, 1000), randBytes(2, 1000)
	mustPut(t, s, present)
	if _, err := s.PutManifest(ctx, testManifest(present, missing)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("PutManifest with a missing chunk = %v, want ErrNotFound", err)
	}
	m := testManifest(present)
	m.Nodes[5].Size++
	if _, err := s.PutManifest(ctx, m); !errors.Is(err, store.ErrInvalidManifest) {
		t.Errorf("PutManifest with a wrong size = %v, want ErrInvalidManifest", err)
	}
	if got := files(t, s.Dir(), "manifests"); len(got) != 0 {
		t.Errorf("manifests written: %v", got)
	}
}

// TestManifestImpliesDurableChunks crashes (copies the directory) right
// after PutManifest: every chunk of the manifest must survive.
func TestManifestImpliesDurableChunks(t *testing.T) {
	s := store.TestStore(t)
	ctx := context.Background()
	c1, c2 := randBytes(1, 300000), randBytes(2, 5000)
	mustPut(t, s, c1)
	mustPut(t, s, c2)
	id, err := s.PutManifest(ctx, testManifest(c1, c2))
	if err != nil {
		t.Fatal(err)
	}
	crashed := reopen(t, copyDir(t, s.Dir()))
	m, err := crashed.LoadManifest(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, cid := range m.ChunkIDs() {
		if _, err := crashed.Get(ctx, cid); err != nil {
			t.Errorf("chunk %s of a durable manifest: %v", cid.Short(), err)
		}
	}
	if _, err := os.Stat(filepath.Join(crashed.Dir(), "manifests", id.String())); err != nil {
		t.Error(err)
	}
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}
