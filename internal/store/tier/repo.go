package tier

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/index"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// Layout of a Repo under its prefix (docs/format.md, "Durable tier"):
//
//	packs/<hh>/<pack id>    packs, as in a store
//	index/<index id>        index files, one per flush or prune
//	manifests/<id>          image manifests
//
// Every object is named by the BLAKE3-256 of its content, so each is
// verified on its own when read. A flush writes packs, then their index
// file, then the manifest: a manifest is listed only once every chunk it
// references is in an index file whose packs are in the bucket.
const (
	packsDir     = "packs/"
	indexDir     = "index/"
	manifestsDir = "manifests/"
)

// PackSize is the size at which a flush finishes a pack, as a store does.
const PackSize = store.DefaultPackSize

// uploads is how many packs a flush uploads at once, and fetches how many
// ranges a fetch reads at once.
const (
	uploads = 4
	fetches = 8
)

// Repo is images in a bucket under a prefix. It has one writer at a
// time (the coordinator flushes and prunes a job's repo under the job's
// lock); any number of readers may fetch meanwhile, except during Prune.
type Repo struct {
	b      Bucket
	prefix string
	// PackSize is the size at which a flush or prune finishes a pack:
	// PackSize (the package's) unless set before use.
	PackSize int

	mu     sync.Mutex
	chunks map[store.ID]loc          // every indexed chunk: where it is
	packs  map[store.ID][]pack.Entry // every indexed pack: its entries
	index  []string                  // keys of the index files loaded
}

// loc is where a chunk is in the repo.
type loc struct {
	pack store.ID
	pack.Entry
}

// OpenRepo reads the index files of the repo under prefix in b. An index
// file that does not verify fails the open (ErrCorrupt) rather than be
// taken for a repo without those chunks.
func OpenRepo(ctx context.Context, b Bucket, prefix string) (*Repo, error) {
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	r := &Repo{b: b, prefix: prefix, PackSize: PackSize}
	if err := r.load(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// String names the repo: its bucket and prefix.
func (r *Repo) String() string { return strings.TrimSuffix(r.b.String(), "/") + "/" + r.prefix }

func (r *Repo) load(ctx context.Context) error {
	objs, err := r.b.List(ctx, r.prefix+indexDir)
	if err != nil {
		return fmt.Errorf("open %s: %w", r, err)
	}
	chunks, packs := map[store.ID]loc{}, map[store.ID][]pack.Entry{}
	var keys []string
	for _, o := range objs {
		id, err := r.idOf(o.Key, indexDir)
		if err != nil {
			return fmt.Errorf("open %s: %w", r, err)
		}
		b, err := r.b.Get(ctx, o.Key)
		if err != nil {
			return fmt.Errorf("open %s: %w", r, err)
		}
		if store.Hash(b) != id {
			return fmt.Errorf("open %s: %w: index file %s does not hash to its name", r, ErrCorrupt, id)
		}
		ps, err := index.Decode(b)
		if err != nil {
			return fmt.Errorf("open %s: %w: index file %s: %w", r, ErrCorrupt, id, err)
		}
		for _, p := range ps {
			packs[p.Pack] = p.Entries
			for _, e := range p.Entries {
				if _, ok := chunks[e.ID]; !ok {
					chunks[e.ID] = loc{pack: p.Pack, Entry: e}
				}
			}
		}
		keys = append(keys, o.Key)
	}
	r.mu.Lock()
	r.chunks, r.packs, r.index = chunks, packs, keys
	r.mu.Unlock()
	return nil
}

// idOf parses the ID that names object key under dir.
func (r *Repo) idOf(key, dir string) (store.ID, error) {
	name := strings.TrimPrefix(key, r.prefix+dir)
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	id, err := store.ParseID(name)
	if err != nil || key != r.key(dir, id) {
		return id, fmt.Errorf("%w: %q is no object of this layout", ErrCorrupt, key)
	}
	return id, nil
}

// key returns the key of object id under dir.
func (r *Repo) key(dir string, id store.ID) string {
	s := id.String()
	if dir == packsDir {
		return r.prefix + dir + s[:2] + "/" + s
	}
	return r.prefix + dir + s
}

// Has reports whether the repo has chunk id indexed.
func (r *Repo) Has(id store.ID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.chunks[id]
	return ok
}

// Chunks returns the IDs of every indexed chunk, sorted.
func (r *Repo) Chunks() []store.ID {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]store.ID, 0, len(r.chunks))
	for id := range r.chunks {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b store.ID) int { return bytes.Compare(a[:], b[:]) })
	return ids
}

// Manifests returns the IDs of the manifests in the repo, sorted.
func (r *Repo) Manifests(ctx context.Context) ([]store.ID, error) {
	objs, err := r.b.List(ctx, r.prefix+manifestsDir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", r, err)
	}
	ids := make([]store.ID, 0, len(objs))
	for _, o := range objs {
		id, err := r.idOf(o.Key, manifestsDir)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", r, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// LoadManifest reads and verifies manifest id.
func (r *Repo) LoadManifest(ctx context.Context, id store.ID) (*store.Manifest, error) {
	b, err := r.b.Get(ctx, r.key(manifestsDir, id))
	if err != nil {
		return nil, fmt.Errorf("manifest %s in %s: %w", id, r, err)
	}
	if got := store.Hash(b); got != id {
		return nil, fmt.Errorf("%w: manifest %s in %s hashes to %s", ErrCorrupt, id, r, got)
	}
	var m store.Manifest
	if err := m.UnmarshalBinary(b); err != nil {
		return nil, fmt.Errorf("%w: manifest %s in %s: %w", ErrCorrupt, id, r, err)
	}
	return &m, nil
}

// FlushStats says what a Flush did.
type FlushStats struct {
	Chunks      int   // chunks the image references
	NewChunks   int   // of them, those the repo lacked and were uploaded
	Bytes       int64 // bytes uploaded: packs, index file and manifest
	Packs       int   // packs uploaded
	ManifestNew bool  // the manifest was uploaded (the repo lacked it)
}

// Flush uploads image manifest m of src into the repo: the chunks the
// repo lacks, as stored in src (verified on the way, never compressed
// again), in packs, then their index file, then the manifest. A chunk of
// src that does not verify fails the flush (store.ErrCorrupt) before
// the manifest is written: the repo never lists an image it cannot give
// back whole. Packs uploaded by a failed flush are unindexed until Prune
// deletes them.
func (r *Repo) Flush(ctx context.Context, src *store.Store, m store.ID) (FlushStats, error) {
	var st FlushStats
	man, err := src.LoadManifest(ctx, m)
	if err != nil {
		return st, fmt.Errorf("flush %s to %s: %w", m, r, err)
	}
	ids := man.ChunkIDs()
	st.Chunks = len(ids)
	var missing []store.ID
	for _, id := range ids {
		if !r.Has(id) {
			missing = append(missing, id)
		}
	}
	st.NewChunks = len(missing)
	packs, n, err := r.uploadPacks(ctx, missing, src.Blob)
	st.Packs, st.Bytes = len(packs), n
	if err != nil {
		return st, fmt.Errorf("flush %s to %s: %w", m, r, err)
	}
	if len(packs) > 0 {
		n, err := r.putIndex(ctx, packs)
		st.Bytes += n
		if err != nil {
			return st, fmt.Errorf("flush %s to %s: %w", m, r, err)
		}
	}
	have, err := r.b.List(ctx, r.key(manifestsDir, m))
	if err != nil {
		return st, fmt.Errorf("flush %s to %s: %w", m, r, err)
	}
	if len(have) == 0 {
		b, err := man.MarshalBinary()
		if err != nil {
			return st, fmt.Errorf("flush %s to %s: %w", m, r, err)
		}
		if err := r.b.Put(ctx, r.key(manifestsDir, m), b); err != nil {
			return st, fmt.Errorf("flush %s to %s: %w", m, r, err)
		}
		st.Bytes += int64(len(b))
		st.ManifestNew = true
	}
	return st, nil
}

// uploadPacks writes the blobs of ids, as get returns them, into packs of
// up to PackSize and uploads them, several at once. It returns the packs
// uploaded and their bytes.
func (r *Repo) uploadPacks(ctx context.Context, ids []store.ID, get func(context.Context, store.ID) (store.Blob, error)) ([]index.PackEntries, int64, error) {
	if len(ids) == 0 {
		return nil, 0, nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(uploads + 1)
	var (
		mu    sync.Mutex
		done  []index.PackEntries
		total int64
	)
	upload := func(buf *bytes.Buffer, w *pack.Writer) error {
		entries, err := w.Finish()
		if err != nil {
			return err
		}
		data := buf.Bytes()
		id := store.Hash(data)
		g.Go(func() error {
			if err := r.b.Put(gctx, r.key(packsDir, id), data); err != nil {
				return err
			}
			mu.Lock()
			done = append(done, index.PackEntries{Pack: id, Entries: entries})
			total += int64(len(data))
			mu.Unlock()
			return nil
		})
		return nil
	}
	g.Go(func() error {
		buf := new(bytes.Buffer)
		w := pack.NewWriter(buf)
		err := inOrder(gctx, ids, get, func(b store.Blob) error {
			if _, err := w.Add(b.ID, b.Data, int(b.RawLength), b.Compression); err != nil {
				return err
			}
			if w.Size() >= uint64(r.PackSize) {
				if err := upload(buf, w); err != nil {
					return err
				}
				buf = new(bytes.Buffer)
				w = pack.NewWriter(buf)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if w.Len() > 0 {
			return upload(buf, w)
		}
		return nil
	})
	err := g.Wait()
	return done, total, err
}

// Reading and verifying a flush's blobs (decompressing and hashing each)
// costs as much CPU as the upload: readers get readBatch blobs each,
// readers batches at once, and the packs take them in order.
const (
	readers   = 2
	readBatch = 256
)

// inOrder gets the blobs of ids, readers batches at once, and hands them
// to add in the order of ids. The first error, of get or add, ends it.
func inOrder(ctx context.Context, ids []store.ID, get func(context.Context, store.ID) (store.Blob, error), add func(store.Blob) error) error {
	type batch struct {
		blobs []store.Blob
		err   error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Each batch's result comes on a channel of its own, queued in
	// order: at most readers batches wait to be added.
	queue := make(chan chan batch, readers)
	go func() {
		defer close(queue)
		for lo := 0; lo < len(ids); lo += readBatch {
			done := make(chan batch, 1)
			select {
			case queue <- done:
			case <-ctx.Done():
				return
			}
			go func(part []store.ID) {
				var b batch
				for _, id := range part {
					blob, err := get(ctx, id)
					if err != nil {
						b.err = err
						break
					}
					b.blobs = append(b.blobs, blob)
				}
				done <- b
			}(ids[lo:min(lo+readBatch, len(ids))])
		}
	}()
	for done := range queue {
		b := <-done
		if b.err != nil {
			return b.err
		}
		for _, blob := range b.blobs {
			if err := add(blob); err != nil {
				return err
			}
		}
	}
	return ctx.Err()
}

// putIndex uploads an index file of packs and adds them to the repo's.
func (r *Repo) putIndex(ctx context.Context, packs []index.PackEntries) (int64, error) {
	b := index.Encode(packs)
	key := r.key(indexDir, store.Hash(b))
	if err := r.b.Put(ctx, key, b); err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.index = append(r.index, key)
	for _, p := range packs {
		r.packs[p.Pack] = p.Entries
		for _, e := range p.Entries {
			if _, ok := r.chunks[e.ID]; !ok {
				r.chunks[e.ID] = loc{pack: p.Pack, Entry: e}
			}
		}
	}
	return int64(len(b)), nil
}

// FetchStats says what a Fetch did.
type FetchStats struct {
	Chunks    int   // chunks the image references
	NewChunks int   // of them, those dst lacked and were fetched
	Bytes     int64 // bytes read from the tier
}

// Fetch brings image manifest m from the repo into dst: the chunks dst
// lacks, read by ranges of their packs, each verified (decompressed and
// hashed) before dst stores it, then the manifest. A damaged object fails
// the fetch with an error matching ErrCorrupt and nothing of it is
// stored; the chunks verified before stay (they are unreferenced until a
// manifest names them).
func (r *Repo) Fetch(ctx context.Context, dst *store.Store, m store.ID) (FetchStats, error) {
	var st FetchStats
	man, err := r.LoadManifest(ctx, m)
	if err != nil {
		return st, fmt.Errorf("fetch: %w", err)
	}
	ids := man.ChunkIDs()
	st.Chunks = len(ids)
	ids = slices.DeleteFunc(ids, dst.Has)
	st.NewChunks = len(ids)
	st.Bytes, err = r.read(ctx, ids, func(b store.Blob) error {
		_, err := dst.PutBlob(ctx, b)
		return err
	})
	if err != nil {
		return st, fmt.Errorf("fetch %s from %s: %w", m, r, err)
	}
	if _, err := dst.PutManifest(ctx, man); err != nil {
		return st, fmt.Errorf("fetch %s from %s: %w", m, r, err)
	}
	return st, nil
}

// read reads the blobs of chunks ids (each once) by ranges of their packs,
// several at once, and hands each to each, which verifies it; it returns
// the bytes read. A chunk no index file lists is damage (ErrCorrupt).
func (r *Repo) read(ctx context.Context, ids []store.ID, each func(store.Blob) error) (int64, error) {
	byPack := map[store.ID][]loc{}
	seen := map[store.ID]bool{}
	r.mu.Lock()
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		l, ok := r.chunks[id]
		if !ok {
			r.mu.Unlock()
			return 0, fmt.Errorf("%w: chunk %s is in no index file", ErrCorrupt, id)
		}
		byPack[l.pack] = append(byPack[l.pack], l)
	}
	r.mu.Unlock()
	var bytes atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fetches)
	for p, ls := range byPack {
		for _, run := range runs(ls) {
			g.Go(func() error {
				n, err := r.readRun(gctx, p, run, each)
				bytes.Add(n)
				return err
			})
		}
	}
	err := g.Wait()
	return bytes.Load(), err
}

// maxRun is the most bytes one range read of a fetch asks for.
const maxRun = 8 << 20

// runs sorts the chunks of one pack by offset and groups them into runs
// of at most maxRun bytes read by one range request each, bridging gaps
// of up to 64 KiB rather than asking twice.
func runs(ls []loc) [][]loc {
	slices.SortFunc(ls, func(a, b loc) int { return cmp.Compare(a.Offset, b.Offset) })
	var out [][]loc
	for i := 0; i < len(ls); {
		j := i + 1
		for j < len(ls) && ls[j].End()-ls[i].Offset <= maxRun && ls[j].Offset <= ls[j-1].End()+64<<10 {
			j++
		}
		out = append(out, ls[i:j])
		i = j
	}
	return out
}

// readPack reads n bytes at off of pack p, which an index file lists: a
// pack gone, or shorter than the index says (truncated), is damage.
func (r *Repo) readPack(ctx context.Context, p store.ID, off, n int64) ([]byte, error) {
	b, err := r.b.GetRange(ctx, r.key(packsDir, p), off, n)
	switch {
	case errors.Is(err, ErrNotExist):
		return nil, fmt.Errorf("%w: pack %s is indexed but gone: %w", ErrCorrupt, p, err)
	case errors.Is(err, ErrShort):
		return nil, fmt.Errorf("%w: pack %s is shorter than its index says (truncated): %w", ErrCorrupt, p, err)
	}
	return b, err
}

// fetchRun reads one run of blobs of pack p and stores each in dst once
// verified.
func (r *Repo) fetchRun(ctx context.Context, dst *store.Store, p store.ID, run []loc) (int64, error) {
	return r.readRun(ctx, p, run, func(b store.Blob) error {
		_, err := dst.PutBlob(ctx, b)
		return err
	})
}

// readRun reads one run of blobs of pack p with one range request and
// hands each to each, which verifies it: a blob each finds damaged
// (store.ErrCorrupt) is damage in the pack.
func (r *Repo) readRun(ctx context.Context, p store.ID, run []loc, each func(store.Blob) error) (int64, error) {
	start, end := run[0].Offset, run[len(run)-1].End()
	b, err := r.readPack(ctx, p, int64(start), int64(end-start))
	if err != nil {
		return 0, err
	}
	if uint64(len(b)) != end-start {
		return int64(len(b)), fmt.Errorf("%w: pack %s: read %d bytes of %d", ErrCorrupt, p, len(b), end-start)
	}
	for _, l := range run {
		blob := store.Blob{ID: l.ID, Data: b[l.Offset-start : l.End()-start], RawLength: l.RawLength, Compression: l.Compression}
		if err := each(blob); err != nil {
			if errors.Is(err, store.ErrCorrupt) {
				return int64(len(b)), fmt.Errorf("%w: pack %s at offset %d: %w", ErrCorrupt, p, l.Offset, err)
			}
			return int64(len(b)), err
		}
	}
	return int64(len(b)), nil
}

// Get reads the contents of chunks ids, each verified (decompressed and
// hashed), and hands each to keep, once per distinct ID, in no particular
// order and from several goroutines at once: what a lazy restore from the
// tier asks for, read as Fetch reads. It returns the bytes read from the
// tier. A chunk no index file lists, or damaged, fails it with an error
// matching ErrCorrupt.
func (r *Repo) Get(ctx context.Context, ids []store.ID, keep func(id store.ID, data []byte) error) (int64, error) {
	n, err := r.read(ctx, ids, func(b store.Blob) error {
		data, err := store.VerifyBlob(b)
		if err != nil {
			return err
		}
		return keep(b.ID, data)
	})
	if err != nil {
		return n, fmt.Errorf("read from %s: %w", r, err)
	}
	return n, nil
}
