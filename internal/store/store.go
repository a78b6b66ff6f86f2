package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/zeebo/blake3"

	"cairn/internal/store/index"
	"cairn/internal/store/pack"
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

	mu      sync.Mutex // guards the fields below and serialises writes
	cur     *openPack
	unsaved []index.PackEntries // finished packs not yet in an index file
	closed  bool
}

// openPack is the pack being written, under tmp/ until it is finished.
type openPack struct {
	f       *os.File
	bw      *bufio.Writer
	hash    *blake3.Hasher
	w       *pack.Writer
	pending map[ID]pack.Entry
}

// Open opens the store in dir, creating it if needed unless opts.ReadOnly is
// set. A writer takes the store's lock (ErrLocked if another writer has it)
// and recovers from a crash of the previous writer: see the package
// documentation.
func Open(dir string, opts Options) (*Store, error) {
	if opts.PackSize <= 0 {
		opts.PackSize = DefaultPackSize
	}
	s := &Store{dir: dir, opts: opts, log: opts.Logger, idx: index.New()}
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
	return s.recover()
}

// Has reports whether the chunk id is stored or queued in the open pack.
func (s *Store) Has(id ID) bool {
	if s.idx.Has(id) {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pendingLocked(id)
}

// pendingLocked reports whether chunk id is in the open pack.
func (s *Store) pendingLocked(id ID) bool {
	if s.cur == nil {
		return false
	}
	_, ok := s.cur.pending[id]
	return ok
}

// Put stores data as a chunk unless the store already has it. It returns the
// chunk's id and whether data was written. The chunk is durable once a later
// Flush returns nil; if a Flush or a Put fails, the chunks put since the
// last successful Flush may be lost and must be put again.
func (s *Store) Put(ctx context.Context, data []byte) (ID, bool, error) {
	if err := ctx.Err(); err != nil {
		return ID{}, false, err
	}
	id := Hash(data)
	if s.opts.ReadOnly {
		return id, false, fmt.Errorf("put chunk %s: %w", id, ErrReadOnly)
	}
	if len(data) > MaxChunkSize {
		return id, false, fmt.Errorf("put chunk %s: %d bytes is above the %d byte limit", id, len(data), MaxChunkSize)
	}
	if s.Has(id) {
		return id, false, nil
	}
	blob, comp := s.codec.compress(data)

	s.gcLock.RLock()
	defer s.gcLock.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	stored, err := s.addBlobLocked(id, blob, len(data), comp)
	if err != nil {
		return id, false, fmt.Errorf("put chunk %s: %w", id, err)
	}
	return id, stored, nil
}

// addBlobLocked appends the blob of chunk id to the open pack unless the
// store has the chunk, and reports whether it did. The caller holds gcLock
// shared and mu.
func (s *Store) addBlobLocked(id ID, blob []byte, rawLength int, comp pack.Compression) (bool, error) {
	if s.closed {
		return false, ErrClosed
	}
	if s.idx.Has(id) || s.pendingLocked(id) {
		return false, nil // put concurrently
	}
	if s.cur == nil {
		p, err := s.newPack()
		if err != nil {
			return false, err
		}
		s.cur = p
	}
	e, err := s.cur.w.Add(id, blob, rawLength, comp)
	if err != nil {
		s.cur.abort()
		s.cur = nil
		return false, err
	}
	s.cur.pending[id] = e
	if s.cur.w.Size() >= uint64(s.opts.PackSize) {
		if err := s.finishPack(); err != nil {
			return false, err
		}
	}
	return true, nil
}

// Get returns the chunk id, always verified against its hash. It returns an
// error matching ErrNotFound if the store does not have the chunk, and a
// *CorruptError if the stored bytes cannot be read, decompressed or do not
// hash to id.
func (s *Store) Get(ctx context.Context, id ID) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	data, ok, err := s.getPending(id)
	if ok || err != nil {
		return data, err
	}
	_, _, data, err = s.fetch(ctx, id)
	return data, err
}

// fetch reads chunk id from its pack and returns its location, its blob as
// stored and its verified bytes. If the pack has vanished, GC has moved the
// chunk: fetch looks it up again (a reader reloads the index files first)
// and retries once.
func (s *Store) fetch(ctx context.Context, id ID) (loc index.Location, blob, data []byte, err error) {
	loc, ok := s.idx.Lookup(id)
	if !ok {
		return loc, nil, nil, fmt.Errorf("get chunk %s: %w", id, ErrNotFound)
	}
	f, err := os.Open(s.packPath(loc.Pack))
	if errors.Is(err, fs.ErrNotExist) {
		if s.opts.ReadOnly {
			if rerr := s.reloadIndex(ctx); rerr != nil {
				return loc, nil, nil, fmt.Errorf("get chunk %s: %w", id, rerr)
			}
		}
		moved, ok := s.idx.Lookup(id)
		if !ok {
			return loc, nil, nil, fmt.Errorf("get chunk %s: %w", id, ErrNotFound)
		}
		if moved.Pack != loc.Pack {
			loc = moved
			f, err = os.Open(s.packPath(loc.Pack))
		}
	}
	if err != nil {
		return loc, nil, nil, &CorruptError{ID: id, Pack: loc.Pack, Offset: loc.Offset, Err: err}
	}
	defer f.Close()
	blob, data, err = s.load(f, id, loc)
	return loc, blob, data, err
}

// getPending reads a chunk that is still in the open pack.
func (s *Store) getPending(id ID) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false, fmt.Errorf("get chunk %s: %w", id, ErrClosed)
	}
	if s.cur == nil {
		return nil, false, nil
	}
	e, ok := s.cur.pending[id]
	if !ok {
		return nil, false, nil
	}
	if err := s.cur.bw.Flush(); err != nil {
		return nil, false, fmt.Errorf("get chunk %s: flush open pack: %w", id, err)
	}
	_, data, err := s.load(s.cur.f, id, index.Location{Entry: e})
	return data, true, err
}

// load reads, decompresses and verifies the blob at loc, and returns the
// blob and the chunk.
func (s *Store) load(r io.ReaderAt, id ID, loc index.Location) (blob, data []byte, err error) {
	corrupt := func(err error) error {
		return &CorruptError{ID: id, Pack: loc.Pack, Offset: loc.Offset, Err: err}
	}
	blob, err = pack.Load(r, loc.Entry, nil)
	if err != nil {
		return nil, nil, corrupt(err)
	}
	data, err = s.codec.decompress(blob, loc.RawLength, loc.Compression)
	if err != nil {
		return nil, nil, corrupt(err)
	}
	if got := Hash(data); got != id {
		return nil, nil, corrupt(fmt.Errorf("content hashes to %s", got))
	}
	return blob, data, nil
}

// Flush finishes the open pack and writes an index file for every pack not
// yet in one, fsyncing both. When it returns nil, every chunk put before the
// call is durable.
func (s *Store) Flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.opts.ReadOnly {
		return fmt.Errorf("flush: %w", ErrReadOnly)
	}
	s.gcLock.RLock()
	defer s.gcLock.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("flush: %w", ErrClosed)
	}
	return s.flushLocked()
}

func (s *Store) flushLocked() error {
	if s.cur != nil {
		if err := s.finishPack(); err != nil {
			return fmt.Errorf("flush: %w", err)
		}
	}
	if len(s.unsaved) == 0 {
		return nil
	}
	if err := s.writeIndex(s.unsaved); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	s.unsaved = nil
	return nil
}

// writeIndex writes the entries of packs as a new index file.
func (s *Store) writeIndex(packs []index.PackEntries) error {
	b := index.Encode(packs)
	id := Hash(b)
	if err := writeFileAtomic(s.path(tmpDir), s.indexPath(id), b); err != nil {
		return fmt.Errorf("write index %s: %w", id, err)
	}
	return nil
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

// newPack creates a pack under tmp/.
func (s *Store) newPack() (*openPack, error) {
	f, err := os.CreateTemp(s.path(tmpDir), "pack-")
	if err != nil {
		return nil, fmt.Errorf("create pack: %w", err)
	}
	p := &openPack{f: f, bw: bufio.NewWriterSize(f, 1<<20), hash: blake3.New(), pending: make(map[ID]pack.Entry)}
	p.w = pack.NewWriter(io.MultiWriter(p.bw, p.hash))
	return p, nil
}

// abort discards the pack and the chunks in it.
func (p *openPack) abort() {
	_ = p.f.Close()
	_ = os.Remove(p.f.Name())
}

// finishPack commits the open pack and adds it to the in-memory index. The
// pack is then durable, but not yet in an index file.
func (s *Store) finishPack() error {
	id, entries, err := s.commitPack(s.cur)
	s.cur = nil
	if err != nil {
		return err
	}
	s.idx.AddPack(id, entries)
	s.unsaved = append(s.unsaved, index.PackEntries{Pack: id, Entries: entries})
	return nil
}

// commitPack writes p's header, fsyncs it, and moves it to its final name,
// fsyncing the directory. It returns the pack's id and entries. On error, p
// is discarded.
func (s *Store) commitPack(p *openPack) (_ ID, _ []pack.Entry, err error) {
	defer func() {
		if err != nil {
			p.abort()
		}
	}()
	entries, err := p.w.Finish()
	if err != nil {
		return ID{}, nil, fmt.Errorf("finish pack: %w", err)
	}
	if err := p.bw.Flush(); err != nil {
		return ID{}, nil, fmt.Errorf("finish pack: %w", err)
	}
	if err := p.f.Sync(); err != nil {
		return ID{}, nil, fmt.Errorf("finish pack: %w", err)
	}
	var id ID
	p.hash.Sum(id[:0])
	dir := filepath.Dir(s.packPath(id))
	created, err := mkdir(dir)
	if err != nil {
		return id, nil, fmt.Errorf("finish pack %s: %w", id, err)
	}
	if created {
		if err := syncDir(s.path(packsDir)); err != nil {
			return id, nil, fmt.Errorf("finish pack %s: %w", id, err)
		}
	}
	if err := os.Rename(p.f.Name(), s.packPath(id)); err != nil {
		return id, nil, fmt.Errorf("finish pack %s: %w", id, err)
	}
	if err := syncDir(dir); err != nil {
		return id, nil, fmt.Errorf("finish pack %s: %w", id, err)
	}
	if err := p.f.Close(); err != nil {
		return id, nil, fmt.Errorf("finish pack %s: %w", id, err)
	}
	return id, entries, nil
}

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.dir}, elem...)...)
}

func (s *Store) packPath(id ID) string {
	h := id.String()
	return s.path(packsDir, h[:2], h)
}

func (s *Store) indexPath(id ID) string    { return s.path(indexDir, id.String()) }
func (s *Store) manifestPath(id ID) string { return s.path(manifestsDir, id.String()) }
