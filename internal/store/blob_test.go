package store_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
)

// TestBlob moves chunks between stores as stored: compressed and not,
// verified on both sides; a damaged blob is refused and not stored.
func TestBlob(t *testing.T) {
	ctx := context.Background()
	a, b := store.TestStore(t), store.TestStore(t)
	random := make([]byte, 10000)
	for i := range random {
		random[i] = byte(i*i*31 + i>>3)
	}
	for _, data := range [][]byte{bytes.Repeat([]byte("compressible "), 1000), random} {
		id, _, err := a.Put(ctx, data)
		if err != nil {
			t.Fatal(err)
		}
		blob, err := a.Blob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := store.VerifyBlob(blob); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("verify blob: %v", err)
		}
		bad := blob
		bad.Data = bytes.Clone(blob.Data)
		bad.Data[len(bad.Data)/2] ^= 1
		if _, err := b.PutBlob(ctx, bad); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("put of a damaged blob (compression %d): %v, want ErrCorrupt", blob.Compression, err)
		}
		if b.Has(id) {
			t.Fatal("a damaged blob was stored")
		}
		if stored, err := b.PutBlob(ctx, blob); err != nil || !stored {
			t.Fatalf("put blob: %v, %v", stored, err)
		}
		if stored, err := b.PutBlob(ctx, blob); err != nil || stored {
			t.Fatalf("second put of the blob: %v, %v; want nothing written", stored, err)
		}
		if got, err := b.Get(ctx, id); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("get after put blob: %v", err)
		}
	}
	// A blob that claims a raw length its content does not have.
	id, _, _ := a.Put(ctx, []byte("short"))
	blob, _ := a.Blob(ctx, id)
	blob.RawLength++
	if _, err := b.PutBlob(ctx, blob); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("put of a blob with a wrong length: %v, want ErrCorrupt", err)
	}
	if _, err := a.Blob(ctx, store.Hash([]byte("absent"))); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("blob of a missing chunk: %v, want ErrNotFound", err)
	}
}
