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
	"github.com/cairn-hpc/cairn/internal/store/tier"
)

// TestTierRoundTrip: an image flushed to a tier comes back into another
// node's repo whole, under its name and number, from its record; a
// second flush of a changed image uploads only its new chunks.
func TestTierRoundTrip(t *testing.T) {
	ctx := context.Background()
	src, dst := newRepo(t), newRepo(t)
	b := tier.NewMemBucket()
	tr, err := tier.OpenRepo(ctx, b, "jobs/ring")
	if err != nil {
		t.Fatal(err)
	}
	pages := randBytes(1 << 20)
	delta := tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	r1 := &image.Record{Container: "ring.0", Seq: 1, Config: []byte(`{}`)}
	if err := src.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": pages, "core-1.img": []byte("core")}, delta), r1, nil); err != nil {
		t.Fatal(err)
	}
	rec, st, err := src.FlushToTier(ctx, tr, "ring.0", 1)
	if err != nil {
		t.Fatal(err)
	}
	if st.NewChunks != st.Chunks || st.Bytes < 1<<20/2 {
		t.Errorf("first flush: %+v, want every chunk uploaded", st)
	}
	meta, _ := json.Marshal(rec)
	got, fst, err := dst.FetchFromTier(ctx, tr, meta, "ring.0", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Manifest != rec.Manifest || fst.NewChunks != st.Chunks {
		t.Errorf("fetched %s (%+v), want manifest %s and every chunk", got.Name(), fst, rec.Manifest.Short())
	}
	if _, err := dst.Verify(ctx, "ring.0", 1, true, nil); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "criu")
	os.Mkdir(out, 0o700)
	if err := dst.Materialize(ctx, got, out, t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "pages-1.img")); !bytes.Equal(b, pages) {
		t.Fatal("the fetched image's pages differ")
	}

	// One page changed: its chunk only is new.
	pages2 := bytes.Clone(pages)
	copy(pages2[8192:], randBytes(4096))
	r2 := &image.Record{Container: "ring.0", Seq: 2, Config: []byte(`{}`)}
	if err := src.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": pages2, "core-1.img": []byte("core")}, delta), r2, nil); err != nil {
		t.Fatal(err)
	}
	_, st2, err := src.FlushToTier(ctx, tr, "ring.0", 2)
	if err != nil {
		t.Fatal(err)
	}
	if st2.NewChunks != 1 {
		t.Errorf("second flush uploaded %d new chunks, want 1 (the changed page)", st2.NewChunks)
	}
}

// TestTierFetchRefuses: a record from the tier is hostile input. One that
// names another image, one whose config grants what no run would, and an
// image whose objects are damaged are refused as corrupt, and nothing is
// listed; one that names a manifest the tier lacks is not found.
func TestTierFetchRefuses(t *testing.T) {
	ctx := context.Background()
	src := newRepo(t)
	b := tier.NewMemBucket()
	tr, err := tier.OpenRepo(ctx, b, "p")
	if err != nil {
		t.Fatal(err)
	}
	delta := tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	r1 := &image.Record{Container: "ring.0", Seq: 1, Config: []byte(`{}`)}
	if err := src.Ingest(ctx, stage(t, map[string][]byte{"pages-1.img": randBytes(1 << 20), "core-1.img": []byte("core")}, delta), r1, nil); err != nil {
		t.Fatal(err)
	}
	rec, _, err := src.FlushToTier(ctx, tr, "ring.0", 1)
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := json.Marshal(rec)
	refuse := func(name string, meta []byte, container string, want error) {
		t.Helper()
		dst := newRepo(t)
		dst.CheckConfig = func(raw json.RawMessage) error {
			if strings.Contains(string(raw), `"/"`) {
				return errors.New("the host's root as a volume")
			}
			return nil
		}
		_, _, err := dst.FetchFromTier(ctx, tr, meta, container, 1)
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
		if _, lerr := dst.Load(container, 1); lerr == nil {
			t.Errorf("%s: listed after a refused fetch", name)
		}
	}
	refuse("another image's record", meta, "ring.1", image.ErrCorrupt)
	var crafted image.Record
	json.Unmarshal(meta, &crafted)
	crafted.Config = []byte(`{"volumes":[{"host":"/","path":"/host"}]}`)
	craftedMeta, _ := json.Marshal(crafted)
	refuse("a crafted config", craftedMeta, "ring.0", image.ErrCorrupt)
	refuse("not JSON", []byte("{"), "ring.0", image.ErrCorrupt)
	missing := strings.Replace(string(meta), rec.Manifest.String(), strings.Repeat("ab", 32), 1)
	refuse("a manifest the tier lacks", []byte(missing), "ring.0", tier.ErrNotExist)
	objs, _ := b.List(ctx, "p/packs/")
	for _, o := range objs {
		b.Damage(o.Key, int(o.Size/2))
	}
	refuse("damaged packs", meta, "ring.0", image.ErrCorrupt)
}
