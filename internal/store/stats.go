package store

// ChunkSize returns the stored (compressed) and raw lengths of chunk id,
// and whether the store has it, in an index or in the open pack.
func (s *Store) ChunkSize(id ID) (stored, raw int64, ok bool) {
	if loc, ok := s.idx.Lookup(id); ok {
		return int64(loc.Length), int64(loc.RawLength), true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, _, ok := s.pendingEntryLocked(id)
	return int64(e.Length), int64(e.RawLength), ok
}

// Stats count the contents of a store.
type Stats struct {
	// Chunks is the number of distinct chunks in the index.
	Chunks int
	// Packs is the number of packs in the index.
	Packs int
	// StoredBytes is the sum of the chunks' stored (compressed) lengths,
	// each chunk counted once; RawBytes the sum of their raw lengths.
	StoredBytes, RawBytes int64
}

// Stats returns counts of the indexed chunks and packs. Chunks still in a
// writer's open pack are not counted.
func (s *Store) Stats() Stats {
	stored, raw := s.idx.Totals()
	return Stats{
		Chunks:      s.idx.Len(),
		Packs:       len(s.idx.Packs()),
		StoredBytes: int64(stored),
		RawBytes:    int64(raw),
	}
}
