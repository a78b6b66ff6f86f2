package store

import (
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

// commit is a finished pack being committed in the background. Its pending
// map is no longer written; done is closed when id, entries and err are set.
type commit struct {
	p       *openPack
	done    chan struct{}
	id      ID
	entries []pack.Entry
	err     error
}

// maxCommits is how many finished packs may be committing at once.
const maxCommits = 2

// openPack is the pack being written, under tmp/ until it is finished.
type openPack struct {
	f       *os.File
	bw      *asyncWriter // writes to f and hash off the store's lock
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

// Has reports whether the chunk id is stored or queued in the open pack.
func (s *Store) Has(id ID) bool {
	if s.idx.Has(id) {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pendingLocked(id)
}

// pendingLocked reports whether chunk id is in the open pack or in a pack
// being committed.
func (s *Store) pendingLocked(id ID) bool {
	_, _, ok := s.pendingEntryLocked(id)
	return ok
}

// pendingEntryLocked finds chunk id in the open pack (c == nil) or in a pack
// being committed.
func (s *Store) pendingEntryLocked(id ID) (e pack.Entry, c *commit, ok bool) {
	if s.cur != nil {
		if e, ok := s.cur.pending[id]; ok {
			return e, nil, true
		}
	}
	for _, c := range s.commits {
		if e, ok := c.p.pending[id]; ok {
			return e, c, true
		}
	}
	return pack.Entry{}, nil, false
}

// startCommitLocked hands the open pack to a goroutine that writes its
// header, fsyncs and renames it, so that Put goes on filling the next pack
// while the disk catches up. flushLocked waits for it and indexes it.
func (s *Store) startCommitLocked() {
	c := &commit{p: s.cur, done: make(chan struct{})}
	s.cur = nil
	s.commits = append(s.commits, c)
	s.commitSem <- struct{}{}
	go func() {
		defer func() { <-s.commitSem; close(c.done) }()
		c.id, c.entries, c.err = s.commitPack(c.p)
	}()
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
		s.startCommitLocked()
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
	f, release, err := s.openPackFile(loc.Pack)
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
			f, release, err = s.openPackFile(loc.Pack)
		}
	}
	if err != nil {
		return loc, nil, nil, &CorruptError{ID: id, Pack: loc.Pack, Offset: loc.Offset, Err: err}
	}
	defer release()
	blob, data, err = s.load(f, id, loc)
	return loc, blob, data, err
}

// maxOpenPacks bounds the pack file cache.
const maxOpenPacks = 64

// openPackFile returns pack id opened for reading and a release function.
func (s *Store) openPackFile(id ID) (*os.File, func(), error) {
	s.filesMu.Lock()
	defer s.filesMu.Unlock()
	if f, ok := s.files[id]; ok {
		return f, func() {}, nil
	}
	f, err := os.Open(s.packPath(id))
	if err != nil {
		return nil, func() {}, err
	}
	if s.files == nil {
		s.files = map[ID]*os.File{}
	}
	if len(s.files) >= maxOpenPacks {
		return f, func() { f.Close() }, nil
	}
	s.files[id] = f
	return f, func() {}, nil
}

func (s *Store) closePackFiles() {
	s.filesMu.Lock()
	defer s.filesMu.Unlock()
	for id, f := range s.files {
		f.Close()
		delete(s.files, id)
	}
}

// getPending reads a chunk that is still in the open pack.
func (s *Store) getPending(id ID) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false, fmt.Errorf("get chunk %s: %w", id, ErrClosed)
	}
	e, c, ok := s.pendingEntryLocked(id)
	if !ok {
		return nil, false, nil
	}
	if c != nil {
		<-c.done
		if c.err != nil {
			return nil, true, fmt.Errorf("get chunk %s: %w", id, c.err)
		}
		f, err := os.Open(s.packPath(c.id))
		if err != nil {
			return nil, true, &CorruptError{ID: id, Pack: c.id, Offset: e.Offset, Err: err}
		}
		defer f.Close()
		_, data, err := s.load(f, id, index.Location{Pack: c.id, Entry: e})
		return data, true, err
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
	if s.cur != nil || len(s.commits) > 0 {
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

// newPack creates a pack under tmp/.
func (s *Store) newPack() (*openPack, error) {
	f, err := os.CreateTemp(s.path(tmpDir), "pack-")
	if err != nil {
		return nil, fmt.Errorf("create pack: %w", err)
	}
	p := &openPack{f: f, hash: blake3.New(), pending: make(map[ID]pack.Entry)}
	p.bw = newAsyncWriter(io.MultiWriter(f, p.hash))
	p.w = pack.NewWriter(p.bw)
	return p, nil
}

// abort discards the pack and the chunks in it.
func (p *openPack) abort() {
	_ = p.bw.Close()
	_ = p.f.Close()
	_ = os.Remove(p.f.Name())
}

// finishPack commits the open pack and adds it to the in-memory index. The
// pack is then durable, but not yet in an index file.
func (s *Store) finishPack() error {
	if s.cur != nil {
		s.startCommitLocked()
	}
	var first error
	for _, c := range s.commits {
		<-c.done
		if c.err != nil {
			if first == nil {
				first = c.err
			}
			continue
		}
		s.idx.AddPack(c.id, c.entries)
		s.unsaved = append(s.unsaved, index.PackEntries{Pack: c.id, Entries: c.entries})
	}
	s.commits = nil
	return first
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
	if err := p.bw.Close(); err != nil {
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
