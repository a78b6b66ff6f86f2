package image

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/cairn-hpc/cairn/internal/store"
)

// Chunks gives chunk contents by ID, verified, in the order asked: a
// store, or the holders of an image a node does not hold (a lazy
// restore).
type Chunks interface {
	GetSeq(ctx context.Context, ids []store.ID, fn func(data []byte) error) error
}

// Head is what a node learns of an image before any of its chunks: its
// record and manifest, checked as Receive checks them.
type Head struct {
	Record   *Record
	Manifest *store.Manifest
}

// ReadHead reads the head of an export stream of checkpoint container:seq
// (ExportDelta with every chunk left out is the cheapest) and checks it as
// Receive would: one manifest, a record naming exactly container:seq, an
// image's shape. Head.Manifest.ChunkIDs are then the image's chunks in
// order of first use: what a node fetching the image from several holders
// asks them for, learnt from the manifest itself. Damage or a stream for
// another checkpoint is a CorruptError.
func ReadHead(r io.Reader, container string, seq int) (*Head, error) {
	image := fmt.Sprintf("%s:%d", container, seq)
	meta, ids, ms, err := store.ReadHead(r)
	if err == nil {
		var rec Record
		if err = checkImported(meta, ids, ms, &imageRef{container, seq}, &rec); err == nil {
			return &Head{Record: &rec, Manifest: ms[0]}, nil
		}
	}
	return nil, &CorruptError{Image: image, What: "export stream", Reason: err.Error(), Err: err}
}

// IsPages tells whether a file of a CRIU image dir is a pages file.
func IsPages(name string) bool {
	return strings.HasPrefix(name, "pages-") && strings.HasSuffix(name, ".img")
}

// PagesChunks returns the chunks of the image's pages files, by file name
// (pages-N.img): one chunk per page (ParamsFor).
func (h *Head) PagesChunks() map[string][]store.ID {
	out := map[string][]store.ID{}
	for _, n := range h.Manifest.Nodes {
		if dir, name := path.Split(n.Path); dir == CRIUDir+"/" && IsPages(name) && n.Kind == store.KindFile {
			out[name] = n.Chunks
		}
	}
	return out
}

// MaterializeLazy writes an image as Materialize and MaterializeLog do,
// from chunks got from src, except its pages files: those it creates at
// their size with nothing in them (sparse), for a restore to write the
// pages (all, or a lazy one those CRIU reads itself) and serve the rest. It
// writes the output kept with the image to logDst, and its times to
// TimesOf(logDst), if it kept them.
func MaterializeLazy(ctx context.Context, h *Head, src Chunks, criuDst, fsDst, logDst string) error {
	rec, m := h.Record, h.Manifest
	if err := checkShape(m, rec.FilesOnly); err != nil {
		return shapeError(rec.Name(), err)
	}
	write := func(n store.Node, dst string) error {
		return writeFrom(ctx, src, rec, n, dst)
	}
	var fsNodes []store.Node
	for _, n := range m.Nodes {
		switch {
		case strings.HasPrefix(n.Path, CRIUDir+"/"):
			name := n.Path[len(CRIUDir)+1:]
			dst := filepath.Join(criuDst, name)
			if IsPages(name) && n.Kind == store.KindFile {
				if err := sparse(dst, int64(n.Size)); err != nil {
					return err
				}
				continue
			}
			if err := write(n, dst); err != nil {
				return err
			}
		case strings.HasPrefix(n.Path, FSDir+"/"):
			fsNodes = append(fsNodes, n)
		case n.Path == LogName:
			if err := write(n, logDst); err != nil {
				return err
			}
		case n.Path == LogTimesName:
			if err := write(n, TimesOf(logDst)); err != nil {
				return err
			}
		}
	}
	var dirs []dirMeta
	var err error
	for _, n := range fsNodes { // sorted by path: parents first
		name := n.Path[len(FSDir)+1:]
		content := func(p string) error { return write(n, p) }
		if dirs, err = makeEntry(fsDst, name, n, content, dirs); err != nil {
			return err
		}
	}
	return finishDirs(dirs)
}

func sparse(dst string, size int64) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	return errors.Join(f.Truncate(size), f.Close())
}

// writeFrom writes one regular file of an image from src.
func writeFrom(ctx context.Context, src Chunks, rec *Record, n store.Node, dst string) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	k, err := writeChunks(ctx, src, n.Chunks, bw, nil)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %s: %w", rec.Name(), n.Path, err)
	}
	if uint64(k) != n.Size {
		return &CorruptError{Image: rec.Name(), What: n.Path, Reason: fmt.Sprintf("%d bytes, manifest says %d", k, n.Size)}
	}
	return nil
}

// Head returns the head of a checkpoint held here, and the store, open
// for reading, to take its chunks from; the caller closes the store.
func (r Repo) Head(ctx context.Context, container string, seq int) (*Head, *store.Store, error) {
	rec, st, m, err := r.openManifest(ctx, container, seq)
	if err != nil {
		return nil, nil, err
	}
	return &Head{Record: rec, Manifest: m}, st, nil
}
