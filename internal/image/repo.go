package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cairn/internal/durable"
	"cairn/internal/names"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"cairn/internal/store"
)

// Repo is where a node keeps its images: a catalog of records
// (Dir/<container>/<seq>.json) over a content-addressed store (StoreDir)
// that holds every image's files as chunks, each stored once however many
// images share it.
type Repo struct {
	Dir         string // catalog
	StoreDir    string // content-addressed store
	Compression store.Compression
	Logger      *slog.Logger
}

// Progress is called with the bytes done so far and the total (0 if
// unknown). It may be nil.
type Progress func(done, total int64)

func (r Repo) containerDir(container string) string { return filepath.Join(r.Dir, container) }

// checkRef refuses a container name or checkpoint number that cannot be
// one of the catalog's (names.ErrInvalid) before it becomes a path.
func checkRef(container string, seq int) error {
	if err := names.Container(container); err != nil {
		return err
	}
	return names.Seq(seq)
}

func (r Repo) recordPath(container string, seq int) string {
	return filepath.Join(r.containerDir(container), strconv.Itoa(seq)+".json")
}

// OpenWriter opens the store for writing, waiting while another cairn
// process writes to it.
func (r Repo) OpenWriter(ctx context.Context) (*store.Store, error) {
	for {
		st, err := store.Open(r.StoreDir, store.Options{Compression: r.Compression, Logger: r.Logger})
		if !errors.Is(err, store.ErrLocked) {
			return st, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the store lock: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// OpenReader opens the store read-only.
func (r Repo) OpenReader() (*store.Store, error) {
	if _, err := os.Stat(r.StoreDir); err != nil {
		return nil, fmt.Errorf("%w: no store at %s", ErrNotFound, r.StoreDir)
	}
	return store.Open(r.StoreDir, store.Options{ReadOnly: true, Logger: r.Logger})
}

// List returns a container's records, oldest first. A record that does not
// parse is reported in the error slice and left out.
func (r Repo) List(container string) ([]*Record, []error) {
	if err := names.Container(container); err != nil {
		return nil, []error{err}
	}
	ents, err := os.ReadDir(r.containerDir(container))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, []error{err}
	}
	var recs []*Record
	var errs []error
	for _, e := range ents {
		seq, ok := seqOf(e.Name())
		if !ok {
			continue
		}
		rec, err := r.Load(container, seq)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recs = append(recs, rec)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Seq < recs[j].Seq })
	return recs, errs
}

func seqOf(name string) (int, bool) {
	s, ok := strings.CutSuffix(name, ".json")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0
}

// All returns the records of every container, by container then seq.
func (r Repo) All() ([]*Record, []error) {
	names, err := r.Containers()
	if err != nil {
		return nil, []error{err}
	}
	var all []*Record
	var errs []error
	for _, n := range names {
		recs, e := r.List(n)
		all, errs = append(all, recs...), append(errs, e...)
	}
	return all, errs
}

// Containers lists the containers that have images.
func (r Repo) Containers() ([]string, error) {
	ents, err := os.ReadDir(r.Dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// Latest returns the newest record of a container.
func (r Repo) Latest(container string) (*Record, error) {
	if err := names.Container(container); err != nil {
		return nil, err
	}
	recs, _ := r.List(container)
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w: container %s has no checkpoint", ErrNotFound, container)
	}
	return recs[len(recs)-1], nil
}

// NextSeq returns the number the next image of container gets.
func (r Repo) NextSeq(container string) int {
	ents, _ := os.ReadDir(r.containerDir(container))
	next := 1
	for _, e := range ents {
		name := e.Name()
		if i := strings.IndexByte(name, '.'); i >= 0 {
			name = name[:i]
		}
		if n, err := strconv.Atoi(name); err == nil && n >= next {
			next = n + 1
		}
	}
	return next
}

// Load reads one record.
func (r Repo) Load(container string, seq int) (*Record, error) {
	if err := checkRef(container, seq); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("%s:%d", container, seq)
	b, err := os.ReadFile(r.recordPath(container, seq))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		return nil, err
	}
	var rec Record
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return nil, &CorruptError{Image: name, What: "record", Reason: err.Error()}
	}
	if rec.Version != RecordVersion || rec.Container != container || rec.Seq != seq || rec.Manifest.IsNull() {
		return nil, &CorruptError{Image: name, What: "record", Reason: fmt.Sprintf("version %d, names %s, manifest %s", rec.Version, rec.Name(), rec.Manifest.Short())}
	}
	return &rec, nil
}

func (r Repo) saveRecord(rec *Record) error {
	if err := checkRef(rec.Container, rec.Seq); err != nil {
		return err
	}
	rec.Version = RecordVersion
	if err := os.MkdirAll(r.containerDir(rec.Container), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return durable.WriteFile(r.recordPath(rec.Container, rec.Seq), b, 0o600)
}

// SetPinned pins (or unpins) a checkpoint: gc keeps pinned checkpoints
// whatever the retention policy.
func (r Repo) SetPinned(container string, seq int, pinned bool) error {
	rec, err := r.Load(container, seq)
	if err != nil {
		return err
	}
	rec.Pinned = pinned
	return r.saveRecord(rec)
}

// Remove deletes a checkpoint's record. Its data stays in the store until
// gc finds no other checkpoint uses it.
func (r Repo) Remove(container string, seq int) error {
	if err := checkRef(container, seq); err != nil {
		return err
	}
	if _, err := os.Stat(r.recordPath(container, seq)); err != nil {
		return fmt.Errorf("%w: %s:%d", ErrNotFound, container, seq)
	}
	if err := os.Remove(r.recordPath(container, seq)); err != nil {
		return err
	}
	_ = os.Remove(r.containerDir(container)) // only if empty
	return durable.SyncDir(r.Dir)
}

// CleanTemp removes records an interrupted write left half-written.
func (r Repo) CleanTemp(container string) {
	if names.Container(container) != nil {
		return
	}
	ents, _ := os.ReadDir(r.containerDir(container))
	for _, e := range ents {
		if isTempRecord(e.Name()) {
			_ = os.RemoveAll(filepath.Join(r.containerDir(container), e.Name()))
		}
	}
}

// Ingest stores the staged image in src (CRIU's files under CRIUDir, the
// fs delta as the tar DeltaName and, if there, the container's output
// LogName) as checkpoint rec.Container:rec.Seq:
// every file is cut into chunks that are put into the store (only chunks
// it lacks are written), the image's manifest is written once they are
// durable, and the record last. On error no checkpoint is listed.
func (r Repo) Ingest(ctx context.Context, src string, rec *Record, progress Progress) error {
	st, err := r.OpenWriter(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := os.Stat(r.recordPath(rec.Container, rec.Seq)); err == nil {
		return fmt.Errorf("checkpoint %s already exists", rec.Name())
	}
	var stats ingestStats
	total := dirBytes(src)
	stopProgress := startProgress(progress, &stats.bytes, total)
	defer stopProgress()

	now := time.Now()
	nodes := []store.Node{{Path: CRIUDir, Kind: store.KindDir, Mode: 0o700, MTime: now}}
	criuDir := filepath.Join(src, CRIUDir)
	ents, err := os.ReadDir(criuDir)
	if err != nil {
		return err
	}
	rec.Files = 0
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return fmt.Errorf("staged CRIU image holds non-regular file %s", e.Name())
		}
		name := CRIUDir + "/" + e.Name()
		ids, n, err := ingestFile(ctx, st, filepath.Join(criuDir, e.Name()), name, &stats)
		if err != nil {
			return err
		}
		nodes = append(nodes, store.Node{Path: name, Kind: store.KindFile, Mode: 0o600, MTime: now, Size: n, Chunks: ids})
		rec.Files++
	}
	fsNodes, err := ingestDelta(ctx, st, filepath.Join(src, DeltaName), &stats)
	if err != nil {
		return err
	}
	nodes = append(nodes, fsNodes...)
	// The container's output, if the checkpoint kept it.
	if fi, err := os.Lstat(filepath.Join(src, LogName)); err == nil {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("staged image: %s is not a regular file", LogName)
		}
		ids, n, err := ingestFile(ctx, st, filepath.Join(src, LogName), LogName, &stats)
		if err != nil {
			return err
		}
		nodes = append(nodes, store.Node{Path: LogName, Kind: store.KindFile, Mode: 0o600, MTime: now, Size: n, Chunks: ids})
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	m := &store.Manifest{
		Labels: map[string]string{"cairn.container": rec.Container, "cairn.seq": strconv.Itoa(rec.Seq)},
		Nodes:  nodes,
	}
	id, err := st.PutManifest(ctx, m)
	if err != nil {
		return fmt.Errorf("write checkpoint %s: %w", rec.Name(), err)
	}
	rec.Manifest = id
	rec.Logical = 0
	for _, n := range nodes {
		rec.Logical += int64(n.Size)
	}
	rec.NewChunks, rec.NewBytes = int(stats.newChunks.Load()), stats.newBytes.Load()
	if err := r.saveRecord(rec); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", rec.Name(), err)
	}
	return nil
}

// ingestDelta turns the captured fs delta tar into manifest nodes under
// FSDir, refusing entries restore would refuse.
func ingestDelta(ctx context.Context, st *store.Store, tarPath string, stats *ingestStats) ([]store.Node, error) {
	f, err := os.Open(tarPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	nodes := []store.Node{{Path: FSDir, Kind: store.KindDir, Mode: 0o755, MTime: time.Now()}}
	files := map[string]int{} // tar name -> node index, for hard links
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nodes, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read fs delta: %w", err)
		}
		if err := checkHeader(hdr); err != nil {
			return nil, err
		}
		name, _ := cleanName(hdr.Name)
		n := nodeFromHeader(hdr, name)
		switch hdr.Typeflag {
		case tar.TypeReg:
			if n.Chunks, n.Size, err = putStream(ctx, st, tr, ParamsFor(name), stats); err != nil {
				return nil, fmt.Errorf("ingest %s: %w", name, err)
			}
			files[name] = len(nodes)
		case tar.TypeLink:
			// Stored as a copy: dedup makes it free, but the link itself
			// is not kept (see docs/format.md).
			target, _ := cleanName(hdr.Linkname)
			i, ok := files[target]
			if !ok {
				return nil, fmt.Errorf("%w: hard link %q to %q, which is not a file in the delta", ErrUnsafeEntry, name, target)
			}
			n.Size, n.Chunks = nodes[i].Size, nodes[i].Chunks
		}
		nodes = append(nodes, n)
	}
}

// nodeFromHeader is the manifest node of an fs delta entry (name cleaned),
// without its chunks. checkHeader decides whether it is allowed.
func nodeFromHeader(hdr *tar.Header, name string) store.Node {
	n := store.Node{
		Path: FSDir + "/" + name, Mode: uint32(hdr.Mode & 0o7777),
		UID: uint32(hdr.Uid), GID: uint32(hdr.Gid), MTime: hdr.ModTime,
	}
	for k, v := range hdr.PAXRecords {
		if x, ok := strings.CutPrefix(k, xattrPrefix); ok {
			n.Xattrs = append(n.Xattrs, store.Xattr{Name: x, Value: []byte(v)})
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		n.Kind = store.KindDir
	case tar.TypeReg, tar.TypeLink: // a hard link is kept as a copy
		n.Kind = store.KindFile
	case tar.TypeSymlink:
		n.Kind, n.Target = store.KindSymlink, hdr.Linkname
	case tar.TypeFifo:
		n.Kind = store.KindFIFO
	case typeSocket:
		n.Kind = store.KindSocket
	case tar.TypeChar: // an overlay whiteout is a character device 0:0
		n.Kind, n.Major, n.Minor = store.KindWhiteout, 0, 0
		if hdr.Devmajor != 0 || hdr.Devminor != 0 {
			n.Kind, n.Major, n.Minor = store.KindCharDev, uint32(hdr.Devmajor), uint32(hdr.Devminor)
		}
	case tar.TypeBlock:
		n.Kind, n.Major, n.Minor = store.KindBlockDev, uint32(hdr.Devmajor), uint32(hdr.Devminor)
	}
	return n
}

// UnpackDelta creates the tree of a captured fs delta (DeltaName in a
// staged image) in dst, as Materialize would from the store: the same
// checks (no device other than a whiteout, no path through a symlink of
// the tree, no "..") and the same modes, owners, xattrs and times. It is
// how a rank moved by a migration gets its files without a round trip
// through the store.
func UnpackDelta(ctx context.Context, tarPath, dst string) error {
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer f.Close()
	var dirs []dirMeta
	files := map[string]string{} // tar name -> path written, for hard links
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read fs delta: %w", err)
		}
		if err := checkHeader(hdr); err != nil {
			return err
		}
		name, _ := cleanName(hdr.Name)
		n := nodeFromHeader(hdr, name)
		var content func(p string) error
		switch hdr.Typeflag {
		case tar.TypeReg:
			content = func(p string) error { return copyTo(p, tr) }
			files[name] = filepath.Join(dst, filepath.FromSlash(name))
		case tar.TypeLink:
			target, _ := cleanName(hdr.Linkname)
			src, ok := files[target]
			if !ok {
				return fmt.Errorf("%w: hard link %q to %q, which is not a file in the delta", ErrUnsafeEntry, name, target)
			}
			content = func(p string) error {
				in, err := os.Open(src)
				if err != nil {
					return err
				}
				defer in.Close()
				return copyTo(p, in)
			}
		}
		if dirs, err = makeEntry(dst, name, n, content, dirs); err != nil {
			return err
		}
	}
	return finishDirs(dirs)
}

// copyTo writes r into a new file at p.
func copyTo(p string, r io.Reader) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Materialize writes an image out for a restore: CRIU's files into
// criuDst and the fs delta as a tree into fsDst (both must exist); the
// container's output is MaterializeLog's. Every
// chunk is verified against its id as it is read, so what lands is exactly
// what was checkpointed, or it fails with a *CorruptError that names the
// damaged data and every checkpoint that uses it. Nothing outside criuDst
// and fsDst is written.
func (r Repo) Materialize(ctx context.Context, rec *Record, criuDst, fsDst string, progress Progress) error {
	st, m, err := r.openReaderRepairing(ctx, rec)
	if err != nil {
		return err
	}
	defer st.Close()
	// Hold a read session: a concurrent gc waits for it before it deletes
	// any pack.
	release, err := st.ReadSession(ctx)
	if err != nil {
		return err
	}
	defer release()
	if err := checkShape(m); err != nil {
		return shapeError(rec.Name(), err)
	}
	var done atomic.Int64
	total := rec.Logical // but the output, which MaterializeLog writes
	for _, n := range m.Nodes {
		if n.Path == LogName {
			total -= int64(n.Size)
		}
	}
	stop := startProgress(progress, &done, total)
	defer stop()
	var fsNodes []store.Node
	for _, n := range m.Nodes {
		switch {
		case strings.HasPrefix(n.Path, CRIUDir+"/"):
			if err := r.writeFile(ctx, st, rec, n, filepath.Join(criuDst, n.Path[len(CRIUDir)+1:]), &done); err != nil {
				return err
			}
		case strings.HasPrefix(n.Path, FSDir+"/"):
			fsNodes = append(fsNodes, n)
		}
	}
	return r.materializeFS(ctx, st, rec, fsNodes, fsDst, &done)
}

// MaterializeLog writes the container's output kept with an image (the
// manifest's LogName) to a new file dst, every chunk verified as in
// Materialize. It reports false, and writes nothing, for an image that
// kept no output.
func (r Repo) MaterializeLog(ctx context.Context, rec *Record, dst string) (bool, error) {
	st, m, err := r.openReaderRepairing(ctx, rec)
	if err != nil {
		return false, err
	}
	defer st.Close()
	release, err := st.ReadSession(ctx)
	if err != nil {
		return false, err
	}
	defer release()
	if err := checkShape(m); err != nil {
		return false, shapeError(rec.Name(), err)
	}
	for _, n := range m.Nodes {
		if n.Path == LogName {
			return true, r.writeFile(ctx, st, rec, n, dst, nil)
		}
	}
	return false, nil
}

// openReaderRepairing opens the store read-only. A reader does no
// recovery: if it cannot open, or the image's chunks are not all in the
// index (index files lost, or packs a crash left unindexed), the store is
// opened once as a writer, which re-indexes every pack from its header.
// It returns the store and the image's manifest, loaded once.
func (r Repo) openReaderRepairing(ctx context.Context, rec *Record) (*store.Store, *store.Manifest, error) {
	st, err := r.OpenReader()
	if errors.Is(err, ErrNotFound) {
		return nil, nil, err
	}
	if err == nil {
		m, err := r.loadManifest(ctx, st, rec)
		if err != nil {
			st.Close()
			return nil, nil, err
		}
		if hasAll(st, m) {
			return st, m, nil
		}
		st.Close()
	}
	if r.Logger != nil {
		r.Logger.Warn("store index incomplete; re-indexing packs", "ckpt", rec.Name())
	}
	w, err := r.OpenWriter(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := w.Close(); err != nil {
		return nil, nil, err
	}
	if st, err = r.OpenReader(); err != nil {
		return nil, nil, err
	}
	m, err := r.loadManifest(ctx, st, rec)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return st, m, nil
}

func hasAll(st *store.Store, m *store.Manifest) bool {
	for _, id := range m.ChunkIDs() {
		if !st.Has(id) {
			return false
		}
	}
	return true
}

// openManifest loads a checkpoint's record, opens the store for reading
// and loads the image's manifest. The caller closes st.
func (r Repo) openManifest(ctx context.Context, container string, seq int) (*Record, *store.Store, *store.Manifest, error) {
	rec, err := r.Load(container, seq)
	if err != nil {
		return nil, nil, nil, err
	}
	st, err := r.OpenReader()
	if err != nil {
		return nil, nil, nil, err
	}
	m, err := r.loadManifest(ctx, st, rec)
	if err != nil {
		st.Close()
		return nil, nil, nil, err
	}
	return rec, st, m, nil
}

func (r Repo) loadManifest(ctx context.Context, st *store.Store, rec *Record) (*store.Manifest, error) {
	m, err := st.LoadManifest(ctx, rec.Manifest)
	if err != nil {
		if errors.Is(err, store.ErrCorrupt) || errors.Is(err, store.ErrNotFound) {
			return nil, &CorruptError{Image: rec.Name(), What: "manifest " + rec.Manifest.String(), Reason: err.Error(), Err: err}
		}
		return nil, err
	}
	return m, nil
}

func (r Repo) writeFile(ctx context.Context, st *store.Store, rec *Record, n store.Node, dst string, done *atomic.Int64) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	k, err := writeChunks(ctx, st, n.Chunks, bw, done)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return r.corrupt(ctx, rec, err)
	}
	if uint64(k) != n.Size {
		return &CorruptError{Image: rec.Name(), What: n.Path, Reason: fmt.Sprintf("%d bytes, manifest says %d", k, n.Size)}
	}
	return nil
}

// corrupt names every checkpoint affected by a damaged chunk.
func (r Repo) corrupt(ctx context.Context, rec *Record, err error) error {
	err = storeErr(rec.Name(), err)
	var ce *CorruptError
	var sce *store.CorruptError
	if errors.As(err, &ce) && errors.As(err, &sce) {
		ce.Affected = r.usersOf(ctx, sce.ID)
	}
	return err
}

// usersOf returns the checkpoints whose images use the chunk id.
func (r Repo) usersOf(ctx context.Context, id store.ID) []string {
	st, err := r.OpenReader()
	if err != nil {
		return nil
	}
	defer st.Close()
	recs, _ := r.All()
	var names []string
	for _, rec := range recs {
		m, err := st.LoadManifest(ctx, rec.Manifest)
		if err != nil {
			continue
		}
		for _, c := range m.ChunkIDs() {
			if c == id {
				names = append(names, rec.Name())
				break
			}
		}
	}
	return names
}

// materializeFS creates the fs delta's tree in dst. Device nodes (other
// than whiteouts) are refused, and no path is ever resolved through a
// symlink the tree made, so nothing is written outside dst. Socket files
// are made unbound: CRIU replaces those its restored listeners are bound
// to (checkFSNode).
func (r Repo) materializeFS(ctx context.Context, st *store.Store, rec *Record, nodes []store.Node, dst string, done *atomic.Int64) error {
	var dirs []dirMeta
	var err error
	for _, n := range nodes { // sorted by path: parents first
		name := n.Path[len(FSDir)+1:]
		content := func(p string) error { return r.writeFile(ctx, st, rec, n, p, done) }
		if dirs, err = makeEntry(dst, name, n, content, dirs); err != nil {
			return err
		}
	}
	return finishDirs(dirs)
}

// dirMeta is a directory made by makeEntry whose metadata is set last, once
// everything in it is made.
type dirMeta struct {
	p string
	n store.Node
}

// makeEntry creates one entry of an fs delta tree under dst (parents
// first), refusing unsafe names and kinds and any path through a symlink
// of the tree; content writes a regular file's bytes to a new file at its
// path. Directories get their metadata from finishDirs.
func makeEntry(dst, name string, n store.Node, content func(p string) error, dirs []dirMeta) ([]dirMeta, error) {
	if err := checkFSNode(name, n); err != nil {
		return dirs, err
	}
	if err := checkParents(dst, name); err != nil {
		return dirs, err
	}
	p := filepath.Join(dst, filepath.FromSlash(name))
	switch n.Kind {
	case store.KindDir:
		if err := os.Mkdir(p, 0o700); err != nil {
			return dirs, err
		}
		return append(dirs, dirMeta{p, n}), nil
	case store.KindFile:
		if content == nil {
			return dirs, fmt.Errorf("%s: a file without content", name)
		}
		if err := content(p); err != nil {
			return dirs, err
		}
	case store.KindSymlink:
		if err := os.Symlink(n.Target, p); err != nil {
			return dirs, err
		}
	case store.KindFIFO:
		if err := mkfifo(p, n.Mode); err != nil {
			return dirs, err
		}
	case store.KindSocket:
		if err := mkSocket(p, n.Mode); err != nil {
			return dirs, fmt.Errorf("make socket file %s: %w", name, err)
		}
	case store.KindWhiteout:
		if err := mkWhiteout(p, n.Mode); err != nil {
			return dirs, fmt.Errorf("make whiteout %s: %w", name, err)
		}
	default:
		return dirs, fmt.Errorf("%w: %q is a %s", ErrUnsafeEntry, name, kindName(n.Kind))
	}
	if err := applyNodeMeta(p, n); err != nil {
		return dirs, fmt.Errorf("%s: %w", name, err)
	}
	return dirs, nil
}

// finishDirs sets the metadata of the directories made, deepest first.
func finishDirs(dirs []dirMeta) error {
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := applyNodeMeta(dirs[i].p, dirs[i].n); err != nil {
			return err
		}
	}
	return nil
}

func kindName(k store.Kind) string {
	switch k {
	case store.KindCharDev:
		return "character device"
	case store.KindBlockDev:
		return "block device"
	case store.KindSocket:
		return "socket"
	}
	return fmt.Sprintf("file of kind %d", k)
}

// Verify checks a checkpoint: its record, its manifest (and its shape),
// and that every chunk it uses is in the index, in a pack that exists and
// whose header lists it; with readData, every chunk is read and checked
// against its id. A problem is a *CorruptError (ErrNotFound for a
// checkpoint that does not exist).
func (r Repo) Verify(ctx context.Context, container string, seq int, readData bool, progress Progress) (*Record, error) {
	rec, err := r.Load(container, seq)
	if err != nil {
		return nil, err
	}
	st, err := r.OpenReader()
	if err != nil {
		return rec, err
	}
	defer st.Close()
	release, err := st.ReadSession(ctx)
	if err != nil {
		return rec, err
	}
	defer release()
	m, err := r.loadManifest(ctx, st, rec)
	if err != nil {
		return rec, err
	}
	if err := checkShape(m); err != nil {
		return rec, shapeError(rec.Name(), err)
	}
	if !readData {
		bad, err := st.CheckChunks(ctx, m.ChunkIDs())
		if err != nil {
			return rec, err
		}
		if len(bad) == 0 {
			return rec, nil
		}
		reason := bad[0].Err.Error()
		if len(bad) > 1 {
			reason += fmt.Sprintf(" (and %d more chunks)", len(bad)-1)
		}
		return rec, &CorruptError{Image: rec.Name(), What: "chunk " + bad[0].ID.String(), Reason: reason, Affected: r.usersOf(ctx, bad[0].ID), Err: bad[0].Err}
	}
	var done atomic.Int64
	stop := startProgress(progress, &done, rec.Logical)
	defer stop()
	for _, n := range m.Nodes {
		k, err := writeChunks(ctx, st, n.Chunks, io.Discard, &done)
		if err != nil {
			return rec, r.corrupt(ctx, rec, err)
		}
		if uint64(k) != n.Size {
			return rec, &CorruptError{Image: rec.Name(), What: n.Path, Reason: fmt.Sprintf("%d bytes, manifest says %d", k, n.Size)}
		}
	}
	return rec, nil
}

// ReadDeltaFile returns the contents of one regular file of an image's fs
// delta (path relative to the container root, slash-separated).
func (r Repo) ReadDeltaFile(ctx context.Context, container string, seq int, name string) ([]byte, error) {
	rec, st, m, err := r.openManifest(ctx, container, seq)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	want := path.Join(FSDir, name)
	for _, n := range m.Nodes {
		if n.Path == want && n.Kind == store.KindFile {
			var buf bytes.Buffer
			if _, err := writeChunks(ctx, st, n.Chunks, &buf, nil); err != nil {
				return nil, r.corrupt(ctx, rec, err)
			}
			return buf.Bytes(), nil
		}
	}
	return nil, fmt.Errorf("%s not in the fs delta of %s: %w", name, rec.Name(), os.ErrNotExist)
}

func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// startProgress calls p every 100 ms with the count until stop is called,
// and once more at the end.
func startProgress(p Progress, done *atomic.Int64, total int64) (stop func()) {
	if p == nil {
		return func() {}
	}
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				p(done.Load(), total)
				return
			case <-t.C:
				p(done.Load(), total)
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// IsCorrupt reports whether err says an image is corrupt.
func IsCorrupt(err error) bool { return errors.Is(err, ErrCorrupt) }
