package store

import (
	"log/slog"
	"testing"
)

// TestOptions returns Options for tests: the fastest compression, small
// packs, and a logger that writes to the test's output.
func TestOptions(t testing.TB) Options {
	return Options{
		Compression: CompressionFastest,
		PackSize:    1 << 20,
		Logger:      slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// TestStore opens a writable store with TestOptions in a new temporary
// directory, and closes it when the test ends.
func TestStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), TestOptions(t))
	if err != nil {
		t.Fatalf("open test store: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close test store: %v", err)
		}
	})
	return s
}

// WaitForCommits waits until every finished pack of s has been committed
// (fsynced and renamed) in the background. It does not write an index, so
// tests can look at the store as a crash right after that would leave it.
func WaitForCommits(s *Store) {
	s.mu.Lock()
	commits := append([]*commit(nil), s.commits...)
	s.mu.Unlock()
	for _, c := range commits {
		<-c.done
	}
}

// Locate returns where the blob of chunk id is: its pack file, offset and
// stored length. It is for tests that damage a chunk on purpose.
func Locate(s *Store, id ID) (path string, offset int64, length int, ok bool) {
	loc, ok := s.idx.Lookup(id)
	if !ok {
		return "", 0, 0, false
	}
	return s.packPath(loc.Pack), int64(loc.Offset), int(loc.Length), true
}
