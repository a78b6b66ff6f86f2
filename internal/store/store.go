package store

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/cairn-hpc/cairn/internal/store/index"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// DefaultPackSize is the size at which a pack is finished unless
// Options.PackSize says otherwise.
const DefaultPackSize = 16 << 20

// MaxChunkSize is the largest chunk Put accepts.
const MaxChunkSize = pack.MaxBlobSize

// Provider reads chunks. It is what a consumer that only restores or
// replicates needs from a store.
type Provider interface {
	// Has reports whether the chunk is stored.
	Has(id ID) bool
	// Get returns the chunk's bytes, verified against id, in a new slice
	// owned by the caller. It returns an error matching ErrNotFound for an
	// unknown id and a *CorruptError if the stored bytes are damaged.
	Get(ctx context.Context, id ID) ([]byte, error)
}

// Ingester adds chunks.
type Ingester interface {
	// Put stores data unless a chunk with its id is already stored, and
	// returns the id and whether data was written. The chunk is durable
	// only after a later Flush returns nil.
	Put(ctx context.Context, data []byte) (id ID, stored bool, err error)
	// Flush makes every chunk put so far durable.
	Flush(ctx context.Context) error
}

var (
	_ Provider = (*Store)(nil)
	_ Ingester = (*Store)(nil)
)

// Options configure Open. The zero value opens a writable store with default
// compression and pack size.
type Options struct {
	// Compression selects the compression of new chunks.
	Compression Compression
	// PackSize is the size at which the open pack is finished; 0 means
	// DefaultPackSize.
	PackSize int
	// ReadOnly opens the store without the writer's lock and without
	// recovery; writes return ErrReadOnly. The store must exist.
	ReadOnly bool
	// Logger receives warnings about recovered damage; nil discards them.
	Logger *slog.Logger
}

// Store is a content-addressed chunk and manifest store in a directory. Its
// methods are safe for concurrent use. See the package documentation for
// durability and locking.
type Store struct {
	dir    string
	opts   Options
	log    *slog.Logger
	codec  *codec
	idx    *index.Index
	lockFd *os.File // nil for readers

	// gcLock is held shared by every write (Put, Flush, PutManifest,
	// RemoveManifest, Import) and exclusively by GC and RebuildIndex, so
	// that they never run concurrently with a write. Reads do not take it.
	gcLock sync.RWMutex

	// files caches open pack files for Get: a restore reads tens of
	// thousands of chunks, and opening the pack for each cost more than
	// reading it. Packs never change once written, and a pack GC deletes
	// stays readable through an open descriptor, so a cached file is never
	// stale; the cache is bounded and emptied by Close.
	filesMu sync.Mutex
	files   map[ID]*os.File

	// commitSem bounds the finished packs being committed (fsynced and
	// renamed) in the background while Put fills the next one.
	commitSem chan struct{}

	mu      sync.Mutex // guards the fields below and serialises writes
	cur     *openPack
	commits []*commit           // finished packs being committed; see startCommitLocked
	unsaved []index.PackEntries // finished packs not yet in an index file
	closed  bool

	// quarantined are the damaged packs this writer's recovery moved to
	// quarantine/.
	quarantined []Quarantine
}

// Open opens the store in dir, creating it if needed unless opts.ReadOnly is
// set. A writer takes the store's lock (ErrLocked if another writer has it)
// and recovers from a crash of the previous writer: see the package
// documentation.
func Open(dir string, opts Options) (*Store, error) {
	if opts.PackSize <= 0 {
		opts.PackSize = DefaultPackSize
	}
	s := &Store{dir: dir, opts: opts, log: opts.Logger, idx: index.New(), commitSem: make(chan struct{}, maxCommits)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if err := s.open(); err != nil {
		if s.codec != nil {
			s.codec.close()
		}
		if s.lockFd != nil {
			_ = s.lockFd.Close()
		}
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	return s, nil
}

func (s *Store) open() error {
	if err := s.initDir(); err != nil {
		return err
	}
	var err error
	if s.codec, err = newCodec(s.opts.Compression); err != nil {
		return err
	}
	if s.opts.ReadOnly {
		// Keep GC from deleting index files and packs while they are read.
		f, err := lockReaders(context.Background(), s.dir, lockShared)
		if err != nil {
			return err
		}
		defer f.Close()
	}
	if err := s.loadDamaged(); err != nil {
		return err
	}
	return s.recover()
}

// Close flushes a writer's store and releases its lock. Using the Store
// after Close returns ErrClosed; a second Close returns nil.
func (s *Store) Close() error {
	s.gcLock.Lock() // wait for a running GC
	defer s.gcLock.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	var err error
	if !s.opts.ReadOnly {
		err = s.flushLocked()
		if s.cur != nil {
			s.cur.abort()
			s.cur = nil
		}
	}
	s.closed = true
	s.closePackFiles()
	s.codec.close()
	if s.lockFd != nil {
		if cerr := s.lockFd.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("release lock: %w", cerr)
		}
	}
	if err != nil {
		return fmt.Errorf("close store %s: %w", s.dir, err)
	}
	return nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.dir}, elem...)...)
}

func (s *Store) packPath(id ID) string {
	h := id.String()
	return s.path(packsDir, h[:2], h)
}

func (s *Store) indexPath(id ID) string    { return s.path(indexDir, id.String()) }
func (s *Store) manifestPath(id ID) string { return s.path(manifestsDir, id.String()) }
