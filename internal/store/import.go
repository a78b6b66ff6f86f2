package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// ImportOptions configure Import.
type ImportOptions struct {
	// Progress, if set, is called on Import's goroutine after each chunk
	// read, with the number of chunks done and the total.
	Progress func(done, total int64)
	// AllowDelta makes Import accept delta export streams
	// (ExportOptions.Skip) as well as self-contained files. Without it a
	// delta stream is refused with ErrDeltaExport, so that a file meant
	// to stand alone never silently depends on what the importing store
	// happens to hold.
	AllowDelta bool
	// Check, if set, is called with the meta and the manifests (their IDs
	// and decoded) once they are read, before any chunk is read or
	// stored, so that the caller can refuse a stream by what it says it
	// holds. If Check returns an error, Import stores nothing and fails
	// with an error that matches ErrCorrupt and wraps Check's.
	Check func(meta []byte, ids []ID, manifests []*Manifest) error
}

// Import reads an export file from r, stores its chunks and then its
// manifests, and returns the manifests' IDs in file order and the meta.
// With opts.AllowDelta it also reads delta export streams: every chunk the
// manifests reference but the stream leaves out must be in the store
// already, or Import fails with an error matching both ErrCorrupt and
// ErrNotFound (the sender's view of this store was stale: a retry should
// ask again what the store lacks) and writes no manifest.
//
// Every chunk is verified against its ID and every manifest against its own
// encoding, and the file's trailing checksum is checked, before any
// manifest is written: a truncated or damaged file gives an error matching
// ErrCorrupt and adds no manifest. (Chunks of a failed import may remain in
// the store, unreferenced, until the next GC.) Import reads r up to the end
// of the checksum and no further. Chunks the store has already are
// verified and not stored again. GC waits while Import runs.
func (s *Store) Import(ctx context.Context, r io.Reader, opts ImportOptions) (manifests []ID, meta []byte, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if s.opts.ReadOnly {
		return nil, nil, fmt.Errorf("import: %w", ErrReadOnly)
	}
	s.gcLock.RLock()
	defer s.gcLock.RUnlock()

	ir := &importReader{r: bufio.NewReaderSize(r, 1<<20), h: blake3.New()}
	order := &chunkOrder{s: s, referenced: make(map[ID]bool), seen: make(map[ID]bool)}
	delta, meta, ms := readHead(ir, opts.AllowDelta)
	if delta && !opts.AllowDelta {
		return nil, nil, fmt.Errorf("import: %w", ErrDeltaExport)
	}
	order.delta = delta
	for _, m := range ms {
		order.reference(m.m)
	}

	if ir.err == nil && opts.Check != nil {
		ids := make([]ID, len(ms))
		decoded := make([]*Manifest, len(ms))
		for i, m := range ms {
			ids[i], decoded[i] = m.id, m.m
		}
		if err := opts.Check(meta, ids, decoded); err != nil {
			return nil, nil, fmt.Errorf("import: %w: refused: %w", ErrCorrupt, err)
		}
	}

	nchunks := ir.u32()
	if ir.err == nil {
		if nref := len(order.referenced); int(nchunks) > nref || !order.delta && int(nchunks) != nref {
			ir.fail("%d chunks for manifests that reference %d", nchunks, nref)
		}
	}
	for i := uint32(0); i < nchunks && ir.err == nil; i++ {
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("import: %w", err)
		}
		if err := s.importChunk(ir, func(id ID) { order.admit(ir, id) }, nil); err != nil {
			return nil, nil, fmt.Errorf("import: %w", err)
		}
		if opts.Progress != nil && ir.err == nil {
			opts.Progress(int64(i+1), int64(nchunks))
		}
	}
	if ir.err == nil {
		order.finish(ir)
	}
	if ir.err == nil {
		want := ir.h.Sum(nil)
		got := make([]byte, IDSize)
		if _, err := io.ReadFull(ir.r, got); err != nil {
			ir.setErr(err)
		} else if !bytes.Equal(got, want) {
			ir.fail("checksum mismatch")
		}
	}
	if ir.err != nil {
		return nil, nil, fmt.Errorf("import: %w", ir.err)
	}

	// Everything is verified: make the chunks durable, check the
	// manifests against the store, then write them.
	for _, m := range ms {
		if err := s.checkDurable(m.m); err != nil {
			if errors.Is(err, ErrInvalidManifest) {
				err = fmt.Errorf("%w: %w", ErrCorrupt, err)
			}
			return nil, nil, fmt.Errorf("import manifest %s: %w", m.id, err)
		}
	}
	var written []ID
	for _, m := range ms {
		dst := s.manifestPath(m.id)
		if _, err := os.Stat(dst); err == nil {
			manifests = append(manifests, m.id)
			continue
		}
		if err := writeFileAtomic(s.path(tmpDir), dst, m.b); err != nil {
			for _, id := range written {
				_ = os.Remove(s.manifestPath(id))
			}
			_ = syncDir(s.path(manifestsDir))
			return nil, nil, fmt.Errorf("import manifest %s: %w", m.id, err)
		}
		written = append(written, m.id)
		manifests = append(manifests, m.id)
	}
	return manifests, meta, nil
}

// importChunk reads one chunk record, has admit check that its chunk may
// come next (admit records in ir why not), verifies it and stores the
// chunk unless the store has it. Format errors are recorded in ir; the
// returned error is for failures of the store.
func (s *Store) importChunk(ir *importReader, admit func(ID), keep func(ID, []byte) error) error {
	hdr := ir.read(exportChunkHeaderSize, exportChunkHeaderSize)
	if ir.err != nil {
		return nil
	}
	var id ID
	copy(id[:], hdr)
	e := pack.Entry{
		ID:          id,
		Offset:      uint64(pack.HeaderOffset),
		Length:      binary.LittleEndian.Uint32(hdr[32:]),
		RawLength:   binary.LittleEndian.Uint32(hdr[36:]),
		Compression: pack.Compression(hdr[40]),
	}
	if hdr[41] != 0 || hdr[42] != 0 || hdr[43] != 0 {
		ir.fail("chunk %s: reserved bytes not zero", id)
	}
	if err := e.Validate(); err != nil && ir.err == nil {
		ir.fail("chunk %s: %v", id, err)
	}
	if ir.err == nil {
		admit(id)
	}
	if ir.err != nil {
		return nil
	}
	blob := ir.readBlob(int(e.Length))
	if ir.err != nil {
		return nil
	}
	data, err := s.codec.decompress(blob, e.RawLength, e.Compression)
	if err != nil {
		ir.fail("chunk %s: %v", id, err)
		return nil
	}
	if got := Hash(data); got != id {
		ir.fail("chunk %s: content hashes to %s", id, got)
		return nil
	}
	if keep != nil {
		return keep(id, data)
	}
	if s.Has(id) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.addBlobLocked(id, blob, int(e.RawLength), e.Compression); err != nil {
		return fmt.Errorf("store chunk %s: %w", id, err)
	}
	return nil
}

// chunkOrder decides which chunk record may come next in an export stream.
// A self-contained file may hold the referenced chunks in any order, each
// once. A delta stream must hold them in order of first reference, which
// makes it canonical and lets the importer check each skipped chunk
// against its store as soon as the stream passes it, rather than after
// reading everything.
type chunkOrder struct {
	s          *Store
	delta      bool
	referenced map[ID]bool
	seen       map[ID]bool
	order      []ID // the referenced chunks in order of first reference
	next       int  // delta: index in order of the next chunk not yet passed
}

// reference adds the chunks of the next manifest of the stream.
func (o *chunkOrder) reference(m *Manifest) {
	for _, c := range m.ChunkIDs() {
		if !o.referenced[c] {
			o.referenced[c] = true
			o.order = append(o.order, c)
		}
	}
}

// admit records in ir why the record for chunk id may not come next, if
// it may not.
func (o *chunkOrder) admit(ir *importReader, id ID) {
	if !o.delta {
		switch {
		case !o.referenced[id]:
			ir.fail("chunk %s is referenced by no manifest", id)
		case o.seen[id]:
			ir.fail("chunk %s twice", id)
		}
		o.seen[id] = true
		return
	}
	if !o.referenced[id] {
		// Say so before walking the skipped chunks: a damaged ID must be
		// reported as damage, not as chunks this store lacks.
		ir.fail("chunk %s is referenced by no manifest", id)
		return
	}
	for ; o.next < len(o.order) && o.order[o.next] != id; o.next++ {
		if !o.skipped(ir, o.order[o.next]) {
			return
		}
	}
	if o.next == len(o.order) {
		ir.fail("chunk %s repeated or out of order", id)
		return
	}
	o.next++
}

// finish checks the chunks a delta stream left out after its last record.
func (o *chunkOrder) finish(ir *importReader) {
	if !o.delta {
		return
	}
	for ; o.next < len(o.order); o.next++ {
		if !o.skipped(ir, o.order[o.next]) {
			return
		}
	}
}

// skipped checks that a chunk the stream left out is in the store. Only
// presence is checked: the store's own chunks were verified when they
// were stored, and are verified again whenever they are read.
func (o *chunkOrder) skipped(ir *importReader, id ID) bool {
	if o.s.Has(id) {
		return true
	}
	if ir.err == nil {
		ir.err = fmt.Errorf("%w: delta export stream: chunk %s is in neither the stream nor the store: %w", ErrCorrupt, id, ErrNotFound)
	}
	return false
}

// importReader reads an export file, hashing what it reads. The first
// error sticks; every format error matches ErrCorrupt.
type importReader struct {
	r   *bufio.Reader
	h   *blake3.Hasher
	err error
	// headersOnly: chunk blobs are not in the checksum (chunk stream
	// version 2).
	headersOnly bool
}

func (ir *importReader) fail(format string, args ...any) {
	if ir.err == nil {
		ir.err = fmt.Errorf("%w: export file: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
}

func (ir *importReader) setErr(err error) {
	if ir.err != nil {
		return
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		ir.err = fmt.Errorf("%w: export file truncated: %w", ErrCorrupt, io.ErrUnexpectedEOF)
		return
	}
	ir.err = fmt.Errorf("read export file: %w", err)
}

// read returns the next n bytes, failing if n is above limit, and adds
// them to the checksum.
func (ir *importReader) read(n, limit int) []byte {
	b := ir.next(n, limit)
	ir.h.Write(b)
	return b
}

// readBlob returns the next chunk blob of n bytes, added to the checksum
// unless the stream's checksum covers headers only.
func (ir *importReader) readBlob(n int) []byte {
	b := ir.next(n, pack.MaxBlobSize)
	if !ir.headersOnly {
		ir.h.Write(b)
	}
	return b
}

// next returns the next n bytes, failing if n is above limit. Up to 1 MiB
// is read into a buffer of its size; above that the buffer grows with the
// bytes actually read, so that a forged length cannot make it allocate
// more than the input holds.
func (ir *importReader) next(n, limit int) []byte {
	if ir.err != nil {
		return nil
	}
	if n < 0 || n > limit {
		ir.fail("length %d above the limit of %d", n, limit)
		return nil
	}
	if n <= 1<<20 {
		b := make([]byte, n)
		if _, err := io.ReadFull(ir.r, b); err != nil {
			ir.setErr(err)
			return nil
		}
		return b
	}
	var buf bytes.Buffer
	got, err := io.Copy(&buf, io.LimitReader(ir.r, int64(n)))
	if err == nil && got < int64(n) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		ir.setErr(err)
		return nil
	}
	return buf.Bytes()
}

func (ir *importReader) u32() uint32 {
	b := ir.read(4, 4)
	if ir.err != nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

// headManifest is a manifest read from the head of an export stream.
type headManifest struct {
	id ID
	b  []byte
	m  *Manifest
}

// readHead reads the head of an export file or delta stream: its magic,
// meta and manifests, each decoded (which checks its encoding); without
// allowDelta it stops after the magic of a delta stream. Errors are
// recorded in ir.
func readHead(ir *importReader, allowDelta bool) (delta bool, meta []byte, ms []headManifest) {
	switch magic := ir.read(len(ExportMagic), len(ExportMagic)); {
	case ir.err != nil, string(magic) == ExportMagic:
	case string(magic) == DeltaExportMagic:
		delta = true
		if !allowDelta {
			return delta, nil, nil
		}
	default:
		ir.fail("magic %q", magic)
	}
	meta = ir.read(int(ir.u32()), MaxExportMetaSize)
	n := ir.u32()
	for i := uint32(0); i < n && ir.err == nil; i++ {
		b := ir.read(int(ir.u32()), MaxManifestSize)
		if ir.err != nil {
			break
		}
		m := new(Manifest)
		if err := m.UnmarshalBinary(b); err != nil {
			ir.fail("manifest %d: %v", i, err)
			break
		}
		id := Hash(b)
		for _, prev := range ms {
			if prev.id == id {
				ir.fail("manifest %s twice", id)
			}
		}
		ms = append(ms, headManifest{id: id, b: b, m: m})
	}
	return delta, meta, ms
}

// ReadHead reads the head of an export file or delta export stream (its
// meta and manifests, each decoded and so checked against its ID) from r
// without a store: how a node fetching an image learns, and checks, what
// it is about to fetch before it asks for any chunk. The rest of the
// stream is left unread.
func ReadHead(r io.Reader) (meta []byte, ids []ID, manifests []*Manifest, err error) {
	ir := &importReader{r: bufio.NewReader(r), h: blake3.New()}
	_, meta, ms := readHead(ir, true)
	if ir.err != nil {
		return nil, nil, nil, fmt.Errorf("read export head: %w", ir.err)
	}
	for _, m := range ms {
		ids = append(ids, m.id)
		manifests = append(manifests, m.m)
	}
	return meta, ids, manifests, nil
}
