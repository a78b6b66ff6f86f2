package store

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestCommitsReaped: the packs a long ingest finishes leave the pending
// list as their commits end, rather than at the next Flush, so that a Put
// looks through a bounded number of pending packs however long the ingest;
// their chunks stay readable and are durable after the Flush.
func TestCommitsReaped(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), Options{PackSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	chunk := func(i int) []byte { // random: stored raw, 16 fill a pack
		var seed [32]byte
		binary.LittleEndian.PutUint64(seed[:], uint64(i))
		b := make([]byte, 4096)
		_, _ = rand.NewChaCha8(seed).Read(b)
		return b
	}
	const n = 16 * 40 // 40 packs of 16 chunks
	var ids []ID
	most := 0
	for i := range n {
		if i%16 == 0 {
			WaitForCommits(s) // as if the disk kept up
		}
		id, stored, err := s.Put(ctx, chunk(i))
		if err != nil || !stored {
			t.Fatalf("put %d: stored %v, %v", i, stored, err)
		}
		ids = append(ids, id)
		s.mu.Lock()
		most = max(most, len(s.commits))
		s.mu.Unlock()
	}
	if most > maxCommits+1 {
		t.Errorf("%d packs pending at once in an ingest of 40 packs whose commits all ended in time; want at most %d", most, maxCommits+1)
	}
	for i, id := range ids {
		if !s.Has(id) {
			t.Fatalf("chunk %d not found before the flush", i)
		}
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	s.Close()
	r, err := Open(s.dir, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i, id := range ids {
		if _, err := r.Get(ctx, id); err != nil {
			t.Fatalf("chunk %d after the flush: %v", i, err)
		}
	}
}
