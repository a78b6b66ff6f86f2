// Package tiertest is the conformance suite of tier.Bucket: what the
// in-memory bucket, the file-system bucket and the S3 bucket must all do,
// so that tests of what runs over a tier may use the fast one.
package tiertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store/tier"
)

// Run runs the suite; open returns a new, empty bucket for each case.
func Run(t *testing.T, open func(t *testing.T) tier.Bucket) {
	ctx := context.Background()
	t.Run("PutGet", func(t *testing.T) {
		b := open(t)
		data := bytes.Repeat([]byte("cairn"), 1000)
		if err := b.Put(ctx, "a/b/c", data); err != nil {
			t.Fatal(err)
		}
		got, err := b.Get(ctx, "a/b/c")
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("get: %d bytes, %v", len(got), err)
		}
		// Objects are replaced whole.
		if err := b.Put(ctx, "a/b/c", []byte("short")); err != nil {
			t.Fatal(err)
		}
		if got, err := b.Get(ctx, "a/b/c"); err != nil || string(got) != "short" {
			t.Fatalf("get after put: %q, %v", got, err)
		}
		if err := b.Put(ctx, "empty", nil); err != nil {
			t.Fatal(err)
		}
		if got, err := b.Get(ctx, "empty"); err != nil || len(got) != 0 {
			t.Fatalf("get empty: %q, %v", got, err)
		}
	})
	t.Run("Missing", func(t *testing.T) {
		b := open(t)
		if _, err := b.Get(ctx, "no/such"); !errors.Is(err, tier.ErrNotExist) {
			t.Fatalf("get of a missing object: %v, want ErrNotExist", err)
		}
		if _, err := b.GetRange(ctx, "no/such", 0, 1); !errors.Is(err, tier.ErrNotExist) {
			t.Fatalf("range of a missing object: %v, want ErrNotExist", err)
		}
		if err := b.Delete(ctx, "no/such"); err != nil {
			t.Fatalf("delete of a missing object: %v", err)
		}
	})
	t.Run("Range", func(t *testing.T) {
		b := open(t)
		data := make([]byte, 100000)
		for i := range data {
			data[i] = byte(i * 7)
		}
		if err := b.Put(ctx, "r", data); err != nil {
			t.Fatal(err)
		}
		for _, r := range [][2]int64{{0, 1}, {0, 100000}, {99999, 1}, {12345, 54321}, {500, 0}} {
			got, err := b.GetRange(ctx, "r", r[0], r[1])
			if err != nil || !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
				t.Fatalf("range %v: %d bytes, %v", r, len(got), err)
			}
		}
		if _, err := b.GetRange(ctx, "r", 99990, 20); !errors.Is(err, tier.ErrShort) {
			t.Fatalf("a range past the end: %v, want ErrShort", err)
		}
	})
	t.Run("List", func(t *testing.T) {
		b := open(t)
		keys := []string{"p/index/1", "p/packs/ab/abc", "p/packs/cd/cde", "p/manifests/m", "q/packs/x", "pz"}
		for i, k := range keys {
			if err := b.Put(ctx, k, make([]byte, i)); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range []struct {
			prefix string
			want   []string
		}{
			{"p/packs/", []string{"p/packs/ab/abc", "p/packs/cd/cde"}},
			{"p/packs/ab/", []string{"p/packs/ab/abc"}},
			{"p/", []string{"p/index/1", "p/manifests/m", "p/packs/ab/abc", "p/packs/cd/cde"}},
			{"p/manifests/m", []string{"p/manifests/m"}},
			{"p/none/", nil},
			{"", []string{"p/index/1", "p/manifests/m", "p/packs/ab/abc", "p/packs/cd/cde", "pz", "q/packs/x"}},
		} {
			objs, err := b.List(ctx, c.prefix)
			if err != nil {
				t.Fatalf("list %q: %v", c.prefix, err)
			}
			var got []string
			for _, o := range objs {
				got = append(got, o.Key)
				if want := int64(slices.Index(keys, o.Key)); o.Size != want {
					t.Errorf("list %q: %s has size %d, want %d", c.prefix, o.Key, o.Size, want)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("list %q: %q, want %q", c.prefix, got, c.want)
			}
		}
		if err := b.Delete(ctx, "p/packs/ab/abc"); err != nil {
			t.Fatal(err)
		}
		if objs, err := b.List(ctx, "p/packs/"); err != nil || len(objs) != 1 {
			t.Fatalf("list after delete: %v, %v", objs, err)
		}
	})
	t.Run("Keys", func(t *testing.T) {
		b := open(t)
		for _, k := range []string{"", "/abs", "a//b", "../up", "a/../b", "a/.", ".hidden", "a/.tmp-1", "nul\x00"} {
			if err := b.Put(ctx, k, []byte("x")); err == nil {
				t.Errorf("put %q: accepted", k)
			}
			if _, err := b.Get(ctx, k); err == nil || errors.Is(err, tier.ErrNotExist) {
				t.Errorf("get %q: %v, want a refusal", k, err)
			}
		}
	})
	t.Run("Many", func(t *testing.T) {
		// More objects than one page of an S3 listing (1,000).
		b := open(t)
		const n = 1100
		for i := range n {
			if err := b.Put(ctx, fmt.Sprintf("m/%04d", i), []byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
		objs, err := b.List(ctx, "m/")
		if err != nil || len(objs) != n {
			t.Fatalf("list: %d objects, %v; want %d", len(objs), err, n)
		}
		if objs[0].Key != "m/0000" || objs[n-1].Key != fmt.Sprintf("m/%04d", n-1) {
			t.Fatalf("list out of order: %s .. %s", objs[0].Key, objs[n-1].Key)
		}
	})
}
