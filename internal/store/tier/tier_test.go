package tier_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/tier"
	"github.com/cairn-hpc/cairn/internal/store/tier/tiertest"
)

func TestMemBucket(t *testing.T) {
	tiertest.Run(t, func(t *testing.T) tier.Bucket { return tier.NewMemBucket() })
}

func TestFileBucket(t *testing.T) {
	tiertest.Run(t, func(t *testing.T) tier.Bucket {
		b, err := tier.OpenFileBucket(t.TempDir() + "/tier")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	})
}

// buckets are the buckets the repo tests run over.
var buckets = map[string]func(t *testing.T) tier.Bucket{
	"mem": func(t *testing.T) tier.Bucket { return tier.NewMemBucket() },
	"file": func(t *testing.T) tier.Bucket {
		b, err := tier.OpenFileBucket(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	},
}

// image is a fake checkpoint image: files of 4 KiB chunks, as CRIU's page
// images are cut.
type image map[string][]byte

// newImage returns an image of n pages of random data, half of them
// compressible.
func newImage(rng *rand.Rand, n int) image {
	data := make([]byte, n*4096)
	for i := range n {
		p := data[i*4096 : (i+1)*4096]
		if i%2 == 0 {
			for j := range p {
				p[j] = byte(rng.Uint32())
			}
		} else {
			copy(p, bytes.Repeat([]byte{byte(i), byte(i >> 8), 'c'}, 4096/3))
		}
	}
	return image{"criu/pages-1.img": data, "criu/core-1.img": []byte("core")}
}

// changed returns a copy of img with frac of its pages rewritten.
func (img image) changed(rng *rand.Rand, frac float64) image {
	out := image{}
	for k, v := range img {
		out[k] = slices.Clone(v)
	}
	p := out["criu/pages-1.img"]
	for i := 0; i < len(p)/4096; i++ {
		if rng.Float64() < frac {
			for j := range 4096 {
				p[i*4096+j] = byte(rng.Uint32())
			}
		}
	}
	return out
}

// put stores img in s and returns its manifest.
func put(t *testing.T, s *store.Store, img image) store.ID {
	t.Helper()
	ctx := context.Background()
	m := &store.Manifest{Labels: map[string]string{"cairn.container": "sim"}}
	m.Nodes = append(m.Nodes, store.Node{Path: "criu", Kind: store.KindDir, Mode: 0o700})
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range img {
			if !yield(k) {
				return
			}
		}
	}) {
		data := img[name]
		n := store.Node{Path: name, Kind: store.KindFile, Mode: 0o600, Size: uint64(len(data))}
		for off := 0; off < len(data); off += 4096 {
			id, _, err := s.Put(ctx, data[off:min(off+4096, len(data))])
			if err != nil {
				t.Fatal(err)
			}
			n.Chunks = append(n.Chunks, id)
		}
		m.Nodes = append(m.Nodes, n)
	}
	id, err := s.PutManifest(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// read returns the image m of s, file by file.
func read(t *testing.T, s *store.Store, m store.ID) image {
	t.Helper()
	ctx := context.Background()
	man, err := s.LoadManifest(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	img := image{}
	for _, n := range man.Nodes {
		if n.Kind != store.KindFile {
			continue
		}
		var b []byte
		for _, id := range n.Chunks {
			d, err := s.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, d...)
		}
		img[n.Path] = b
	}
	return img
}

func equal(a, b image) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func TestFlushFetch(t *testing.T) {
	for name, open := range buckets {
		t.Run(name, func(t *testing.T) { testFlushFetch(t, open) })
	}
}

func testFlushFetch(t *testing.T, open func(t *testing.T) tier.Bucket) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	src := store.TestStore(t)
	img1 := newImage(rng, 2000) // 8 MiB: several packs
	m1 := put(t, src, img1)
	b := open(t)
	repo, err := tier.OpenRepo(ctx, b, "jobs/sim")
	if err != nil {
		t.Fatal(err)
	}
	repo.PackSize = 1 << 20
	st, err := repo.Flush(ctx, src, m1)
	if err != nil {
		t.Fatal(err)
	}
	// Every page is distinct: 2000 chunks and the core file's.
	if st.NewChunks != st.Chunks || st.Chunks != 2001 || !st.ManifestNew || st.Packs < 2 {
		t.Fatalf("first flush: %+v", st)
	}
	// Again: nothing to upload.
	if st, err := repo.Flush(ctx, src, m1); err != nil || st.NewChunks != 0 || st.Bytes != 0 || st.ManifestNew {
		t.Fatalf("second flush of the same image: %+v, %v", st, err)
	}
	// A later image with 10% of its pages changed uploads only those,
	// also through a repo opened afresh (the index is read back).
	img2 := img1.changed(rng, 0.1)
	m2 := put(t, src, img2)
	repo2, err := tier.OpenRepo(ctx, b, "jobs/sim")
	if err != nil {
		t.Fatal(err)
	}
	st2, err := repo2.Flush(ctx, src, m2)
	if err != nil {
		t.Fatal(err)
	}
	man1, _ := src.LoadManifest(ctx, m1)
	man2, _ := src.LoadManifest(ctx, m2)
	old := map[store.ID]bool{}
	for _, id := range man1.ChunkIDs() {
		old[id] = true
	}
	want := 0
	for _, id := range man2.ChunkIDs() {
		if !old[id] {
			want++
		}
	}
	if st2.NewChunks != want || want == 0 || st2.Bytes > st.Bytes/5 {
		t.Fatalf("flush of the changed image: %+v, want %d new chunks and under a fifth of %d bytes", st2, want, st.Bytes)
	}
	t.Logf("first flush %d bytes, second %d bytes (%d of %d chunks new)", st.Bytes, st2.Bytes, st2.NewChunks, st2.Chunks)

	// Fetch both into an empty store: bit for bit.
	dst := store.TestStore(t)
	for _, c := range []struct {
		m   store.ID
		img image
	}{{m1, img1}, {m2, img2}} {
		fs, err := repo2.Fetch(ctx, dst, c.m)
		if err != nil {
			t.Fatal(err)
		}
		if got := read(t, dst, c.m); !equal(got, c.img) {
			t.Fatalf("image %s fetched differs", c.m.Short())
		}
		t.Logf("fetched %s: %+v", c.m.Short(), fs)
	}
	if ms, err := repo2.Manifests(ctx); err != nil || len(ms) != 2 {
		t.Fatalf("manifests: %v, %v", ms, err)
	}
}

// flushedImage flushes an image of 300 pages (from seed) into a repo of
// a memory bucket.
func flushedImage(t *testing.T, seed uint64) (*tier.MemBucket, *tier.Repo, store.ID) {
	t.Helper()
	ctx := context.Background()
	src := store.TestStore(t)
	m := put(t, src, newImage(rand.New(rand.NewPCG(seed, seed+1)), 300))
	b := tier.NewMemBucket()
	repo, err := tier.OpenRepo(ctx, b, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Flush(ctx, src, m); err != nil {
		t.Fatal(err)
	}
	return b, repo, m
}

// TestFetchTruncated: a pack cut short (an upload that lost its end, a
// store that lost a block) is damage: fetch gives ErrCorrupt and stores
// nothing of the image.
func TestFetchTruncated(t *testing.T) {
	ctx := context.Background()
	b, repo, m := flushedImage(t, 5)
	objs, _ := b.List(ctx, "packs/")
	if len(objs) == 0 {
		t.Fatal("no pack")
	}
	for _, o := range objs {
		data, err := b.Get(ctx, o.Key)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Put(ctx, o.Key, data[:len(data)/2]); err != nil {
			t.Fatal(err)
		}
	}
	dst := store.TestStore(t)
	if _, err := repo.Fetch(ctx, dst, m); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("fetch of truncated packs: %v, want ErrCorrupt", err)
	}
	if ms, _ := dst.Manifests(ctx); len(ms) != 0 {
		t.Fatalf("the truncated image was stored: %v", ms)
	}
}

func TestFetchDamaged(t *testing.T) {
	ctx := context.Background()
	b, repo, m := flushedImage(t, 3)
	objs, _ := b.List(ctx, "packs/")
	if len(objs) == 0 || !b.Damage(objs[0].Key, 100) {
		t.Fatal("no pack to damage")
	}
	dst := store.TestStore(t)
	_, err := repo.Fetch(ctx, dst, m)
	if !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("fetch of a damaged pack: %v, want ErrCorrupt", err)
	}
	if ms, _ := dst.Manifests(ctx); len(ms) != 0 {
		t.Fatalf("the damaged image was stored: %v", ms)
	}
	// A damaged manifest and a damaged index file are refused too; the
	// damaged objects stay where they are.
	mkey := "manifests/" + m.String()
	b.Damage(mkey, 3)
	if _, err := repo.Fetch(ctx, dst, m); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("fetch of a damaged manifest: %v, want ErrCorrupt", err)
	}
	if _, err := b.Get(ctx, mkey); err != nil {
		t.Fatalf("the damaged manifest was deleted: %v", err)
	}
	idx, _ := b.List(ctx, "index/")
	b.Damage(idx[0].Key, 20)
	if _, err := tier.OpenRepo(ctx, b, ""); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("open with a damaged index file: %v, want ErrCorrupt", err)
	}
}

func TestFlushDamagedSource(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	src := store.TestStore(t)
	m := put(t, src, newImage(rng, 50))
	man, _ := src.LoadManifest(ctx, m)
	path, off, _, ok := store.Locate(src, man.ChunkIDs()[7])
	if !ok {
		t.Fatal("chunk not found")
	}
	damageFile(t, path, off+10)
	b := tier.NewMemBucket()
	repo, _ := tier.OpenRepo(ctx, b, "")
	if _, err := repo.Flush(ctx, src, m); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("flush of a damaged image: %v, want store.ErrCorrupt", err)
	}
	if ms, _ := repo.Manifests(ctx); len(ms) != 0 {
		t.Fatalf("a manifest was uploaded for a damaged image: %v", ms)
	}
}

func TestPrune(t *testing.T) {
	for name, open := range buckets {
		t.Run(name, func(t *testing.T) { testPrune(t, open) })
	}
}

func testPrune(t *testing.T, open func(t *testing.T) tier.Bucket) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 8))
	src := store.TestStore(t)
	b := open(t)
	repo, err := tier.OpenRepo(ctx, b, "j")
	if err != nil {
		t.Fatal(err)
	}
	repo.PackSize = 256 << 10
	img := newImage(rng, 600)
	var ms []store.ID
	imgs := map[store.ID]image{}
	for range 10 {
		img = img.changed(rng, 0.2)
		m := put(t, src, img)
		if _, err := repo.Flush(ctx, src, m); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
		imgs[m] = img
	}
	keep := ms[len(ms)-3:]
	st, err := repo.Prune(ctx, keep)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("prune: %+v", st)
	if st.Manifests != 7 || st.Packs == 0 || st.Repacked == 0 {
		t.Fatalf("prune: %+v, want 7 manifests and some packs deleted, some repacked", st)
	}
	got, err := repo.Manifests(ctx)
	if err != nil || !slices.Equal(got, slices.SortedFunc(slices.Values(keep), func(a, b store.ID) int { return bytes.Compare(a[:], b[:]) })) {
		t.Fatalf("manifests after prune: %v, %v; want %v", got, err, keep)
	}
	// The bucket holds exactly the kept images' chunks, each once,
	// by listing the packs themselves.
	live := map[store.ID]bool{}
	for _, m := range keep {
		man, _ := src.LoadManifest(ctx, m)
		for _, id := range man.ChunkIDs() {
			live[id] = true
		}
	}
	ids, n, err := repo.Listing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(live) || len(ids) != len(live) {
		t.Fatalf("the bucket holds %d chunks (%d distinct), the kept images %d", n, len(ids), len(live))
	}
	for _, id := range ids {
		if !live[id] {
			t.Fatalf("chunk %s is held but no kept image references it", id.Short())
		}
	}
	if idx, _ := b.List(ctx, "j/index/"); len(idx) != 1 {
		t.Fatalf("%d index files after prune, want 1", len(idx))
	}
	// Each kept image still comes back whole, through a repo opened
	// afresh.
	repo2, err := tier.OpenRepo(ctx, b, "j")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range keep {
		dst := store.TestStore(t)
		if _, err := repo2.Fetch(ctx, dst, m); err != nil {
			t.Fatal(err)
		}
		if !equal(read(t, dst, m), imgs[m]) {
			t.Fatalf("image %s differs after prune", m.Short())
		}
	}
	// Pruning again changes nothing.
	if st, err := repo2.Prune(ctx, keep); err != nil || st.Packs != 0 || st.Manifests != 0 {
		t.Fatalf("second prune: %+v, %v", st, err)
	}
}

func TestPruneRefusesUnknownManifest(t *testing.T) {
	ctx := context.Background()
	b := tier.NewMemBucket()
	src := store.TestStore(t)
	m := put(t, src, newImage(rand.New(rand.NewPCG(9, 9)), 10))
	repo, _ := tier.OpenRepo(ctx, b, "")
	if _, err := repo.Flush(ctx, src, m); err != nil {
		t.Fatal(err)
	}
	before, _ := b.List(ctx, "")
	var other store.ID
	other[0] = 1
	if _, err := repo.Prune(ctx, []store.ID{other}); !errors.Is(err, tier.ErrNotExist) {
		t.Fatalf("prune keeping an unknown manifest: %v, want ErrNotExist", err)
	}
	if after, _ := b.List(ctx, ""); !slices.Equal(before, after) {
		t.Fatalf("a refused prune changed the bucket: %v -> %v", before, after)
	}
}

func TestFileBucketStaysInside(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b, err := tier.OpenFileBucket(dir + "/tier")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Another user plants a symlink to outside in the shared directory.
	if err := symlink(dir, dir+"/tier/packs"); err != nil {
		t.Fatal(err)
	}
	if err := b.Put(ctx, "packs/ab/x", []byte("x")); err == nil {
		t.Fatal("a put went through a symlink to outside the bucket")
	}
	if _, err := b.Get(ctx, "packs/tier"); err == nil || strings.Contains(err.Error(), "not a regular") {
		t.Fatalf("a get went through a symlink to outside the bucket: %v", err)
	}
}

// damageFile flips the byte of file path at off.
func damageFile(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func symlink(target, link string) error {
	if err := os.MkdirAll(filepath.Dir(link), 0o700); err != nil {
		return err
	}
	return os.Symlink(target, link)
}

func TestRecords(t *testing.T) {
	ctx := context.Background()
	b := tier.NewMemBucket()
	repo, _ := tier.OpenRepo(ctx, b, "jobs/sim")
	for _, seq := range []int{3, 1, 12} {
		if err := repo.PutRecord(ctx, seq, []byte(fmt.Sprintf(`{"seq":%d}`, seq))); err != nil {
			t.Fatal(err)
		}
	}
	if err := repo.PutRecord(ctx, 3, []byte(`{"seq":3,"again":true}`)); err != nil {
		t.Fatal(err)
	}
	if seqs, err := repo.Records(ctx); err != nil || !slices.Equal(seqs, []int{1, 3, 12}) {
		t.Fatalf("records: %v, %v", seqs, err)
	}
	if got, err := repo.Record(ctx, 3); err != nil || string(got) != `{"seq":3,"again":true}` {
		t.Fatalf("record 3: %q, %v", got, err)
	}
	if _, err := repo.Record(ctx, 2); !errors.Is(err, tier.ErrNotExist) {
		t.Fatalf("record 2: %v, want ErrNotExist", err)
	}
	objs, _ := b.List(ctx, "jobs/sim/checkpoints/12.")
	b.Damage(objs[0].Key, 2)
	if _, err := repo.Record(ctx, 12); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("damaged record: %v, want ErrCorrupt", err)
	}
	if err := repo.DeleteRecord(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if seqs, _ := repo.Records(ctx); !slices.Equal(seqs, []int{3, 12}) {
		t.Fatalf("records after delete: %v", seqs)
	}
	b.Put(ctx, "jobs/sim/checkpoints/x", []byte("stray"))
	if _, err := repo.Records(ctx); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("a stray key under checkpoints/: %v, want ErrCorrupt", err)
	}
}

// TestGet: a lazy restore's reads give each chunk's content, verified,
// once per distinct ID; a chunk the repo lacks, or a damaged pack, is
// ErrCorrupt.
func TestGet(t *testing.T) {
	ctx := context.Background()
	b, repo, m := flushedImage(t, 7)
	man, err := repo.LoadManifest(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	ids := man.ChunkIDs()
	ids = append(ids, ids[:10]...) // asked twice: handed once
	var mu sync.Mutex
	got := map[store.ID]int{}
	n, err := repo.Get(ctx, ids, func(id store.ID, data []byte) error {
		if store.Hash(data) != id {
			return fmt.Errorf("chunk %s: content hashes to %s", id, store.Hash(data))
		}
		mu.Lock()
		got[id]++
		mu.Unlock()
		return nil
	})
	if err != nil || n == 0 {
		t.Fatalf("get: %d bytes, %v", n, err)
	}
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("chunk %s handed %d times, want once", id, got[id])
		}
	}
	if _, err := repo.Get(ctx, []store.ID{store.Hash([]byte("not in the repo"))}, func(store.ID, []byte) error { return nil }); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("get of a chunk no index lists: %v, want ErrCorrupt", err)
	}
	objs, _ := b.List(ctx, "packs/")
	if len(objs) == 0 || !b.Damage(objs[0].Key, 100) {
		t.Fatal("no pack to damage")
	}
	if _, err := repo.Get(ctx, ids, func(store.ID, []byte) error { return nil }); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("get from a damaged pack: %v, want ErrCorrupt", err)
	}
}
