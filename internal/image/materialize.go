package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/cairn-hpc/cairn/internal/store"
)

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
	if err := checkShape(m, rec.FilesOnly); err != nil {
		return shapeError(rec.Name(), err)
	}
	var done atomic.Int64
	total := rec.Logical // but the output, which MaterializeLog writes
	for _, n := range m.Nodes {
		if isOutput(n.Path) {
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
// manifest's LogName) to a new file dst, and its times (LogTimesName), if
// the image has them, to TimesOf(dst), every chunk verified as in
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
	if err := checkShape(m, rec.FilesOnly); err != nil {
		return false, shapeError(rec.Name(), err)
	}
	kept := false
	for _, n := range m.Nodes {
		switch n.Path {
		case LogName:
			kept = true
			err = r.writeFile(ctx, st, rec, n, dst, nil)
		case LogTimesName:
			err = r.writeFile(ctx, st, rec, n, TimesOf(dst), nil)
		}
		if err != nil {
			return false, err
		}
	}
	return kept, nil
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
