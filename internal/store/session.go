package store

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/cairn-hpc/cairn/internal/store/index"
)

// ReadSession pins the packs of the store until release is called: while
// any read session is open, in this process or another, GC waits before it
// deletes a pack (see the package documentation, "Locking"). A restore,
// export or check opens one session for its whole duration so that every
// chunk it reads stays where the index says. Sessions may overlap and may
// be opened on a reader or on the writer; release may be called more than
// once. ReadSession waits while a GC is deleting packs, until ctx is done.
//
// A session does not refresh a reader's index: a Get of a chunk whose pack
// a GC deleted before the session began reloads the index files and retries
// by itself.
func (s *Store) ReadSession(ctx context.Context) (release func(), err error) {
	f, err := lockReaders(ctx, s.dir, lockShared)
	if err != nil {
		return nil, fmt.Errorf("read session: %w", err)
	}
	var once sync.Once
	return func() { once.Do(func() { _ = f.Close() }) }, nil
}

// reloadIndex replaces a reader's in-memory index with the contents of the
// index files now on disk, read under a shared readers lock so that a GC
// cannot delete files in between. Packs that no index file lists yet are
// not indexed: their chunks were not durable when the reload began.
func (s *Store) reloadIndex(ctx context.Context) error {
	f, err := lockReaders(ctx, s.dir, lockShared)
	if err != nil {
		return fmt.Errorf("reload index: %w", err)
	}
	defer f.Close()
	entries, err := os.ReadDir(s.path(indexDir))
	if err != nil {
		return fmt.Errorf("reload index: %w", err)
	}
	// Blobs a writer set aside since this reader opened stay out too.
	if err := s.loadDamaged(); err != nil {
		return fmt.Errorf("reload index: %w", err)
	}
	var packs []index.PackEntries
	for _, e := range entries {
		id, err := ParseID(e.Name())
		if err != nil {
			continue
		}
		p, err := s.readIndexFile(id)
		if err != nil {
			s.log.Warn("ignoring damaged index file", "index", id.String(), "err", err)
			continue
		}
		packs = append(packs, p...)
	}
	s.idx.Replace(packs)
	return nil
}
