package store_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
)

func randBytes(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// compressible returns n bytes that zstd shrinks a lot.
func compressible(seed uint64, n int) []byte {
	return bytes.Repeat(randBytes(seed, 64), n/64+1)[:n]
}

func mustPut(t testing.TB, s *store.Store, data []byte) store.ID {
	t.Helper()
	id, _, err := s.Put(context.Background(), data)
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	return id
}

func mustGet(t *testing.T, s *store.Store, id store.ID, want []byte) {
	t.Helper()
	got, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id.Short(), err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Get(%s) returned %d bytes that differ from the %d put", id.Short(), len(got), len(want))
	}
}

// files returns the paths, relative to dir, of the regular files under
// dir/sub.
func files(t *testing.T, dir, sub string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(dir, sub), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// copyDir copies a store directory as a crash would leave it on disk: the
// files as they are now, without the lock.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o700)
		}
		if strings.HasSuffix(p, "lock") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func reopen(t *testing.T, dir string) *store.Store {
	t.Helper()
	s, err := store.Open(dir, store.TestOptions(t))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
