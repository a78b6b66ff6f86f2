package store_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
)

// testChunkSize is the size of the fixed chunks putFiles cuts files into.
const testChunkSize = 4 << 10

// putFiles stores each file cut into testChunkSize chunks, then a manifest
// of them, and returns the manifest's ID.
func putFiles(ctx context.Context, s *store.Store, files map[string][]byte) (store.ID, error) {
	m := &store.Manifest{Labels: map[string]string{"test": "files"}}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		data := files[name]
		n := store.Node{Path: name, Kind: store.KindFile, Mode: 0o600, Size: uint64(len(data))}
		for off := 0; off < len(data); off += testChunkSize {
			id, _, err := s.Put(ctx, data[off:min(off+testChunkSize, len(data))])
			if err != nil {
				return store.ID{}, err
			}
			n.Chunks = append(n.Chunks, id)
		}
		m.Nodes = append(m.Nodes, n)
	}
	return s.PutManifest(ctx, m)
}

func mustPutFiles(t *testing.T, s *store.Store, files map[string][]byte) store.ID {
	t.Helper()
	id, err := putFiles(context.Background(), s, files)
	if err != nil {
		t.Fatalf("put files: %v", err)
	}
	return id
}

// readFiles loads the manifest id and reads back its files.
func readFiles(ctx context.Context, s *store.Store, id store.ID) (map[string][]byte, error) {
	m, err := s.LoadManifest(ctx, id)
	if err != nil {
		return nil, err
	}
	files := make(map[string][]byte)
	for _, n := range m.Nodes {
		var b []byte
		for _, c := range n.Chunks {
			d, err := s.Get(ctx, c)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", n.Path, err)
			}
			b = append(b, d...)
		}
		if uint64(len(b)) != n.Size {
			return nil, fmt.Errorf("%s: read %d bytes, size %d", n.Path, len(b), n.Size)
		}
		files[n.Path] = b
	}
	return files, nil
}

// mustReadFiles checks that manifest id holds exactly want.
func mustReadFiles(t *testing.T, s *store.Store, id store.ID, want map[string][]byte) {
	t.Helper()
	got, err := readFiles(context.Background(), s, id)
	if err != nil {
		t.Fatalf("read manifest %s: %v", id.Short(), err)
	}
	if len(got) != len(want) {
		t.Fatalf("manifest %s has %d files, want %d", id.Short(), len(got), len(want))
	}
	for name, w := range want {
		if !bytes.Equal(got[name], w) {
			t.Fatalf("manifest %s: file %s differs (%d bytes, want %d)", id.Short(), name, len(got[name]), len(w))
		}
	}
}

// genFiles returns 1–3 files of up to 24 blocks of testChunkSize bytes,
// each block drawn either from pool (shared with earlier calls) or fresh,
// in which case it joins the pool. Blocks are half compressible.
func genFiles(rng *rand.Rand, pool *[][]byte) map[string][]byte {
	files := make(map[string][]byte)
	for i := range 1 + rng.IntN(3) {
		var data []byte
		for range rng.IntN(25) {
			if len(*pool) > 0 && rng.IntN(2) == 0 {
				data = append(data, (*pool)[rng.IntN(len(*pool))]...)
				continue
			}
			block := make([]byte, testChunkSize)
			for j := range block {
				block[j] = byte(rng.Uint32())
			}
			if rng.IntN(2) == 0 {
				block = bytes.Repeat(block[:64], testChunkSize/64)
			}
			*pool = append(*pool, block)
			data = append(data, block...)
		}
		if rng.IntN(4) == 0 && len(data) > 0 {
			data = data[:len(data)-rng.IntN(testChunkSize)] // a short last chunk
		}
		files[fmt.Sprintf("f%d", i)] = data
	}
	return files
}

// chunksOf returns the distinct chunk IDs of the manifests ids.
func chunksOf(t *testing.T, s *store.Store, ids ...store.ID) map[store.ID]bool {
	t.Helper()
	out := make(map[store.ID]bool)
	for _, id := range ids {
		m, err := s.LoadManifest(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range m.ChunkIDs() {
			out[c] = true
		}
	}
	return out
}
