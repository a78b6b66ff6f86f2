package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/cairn-hpc/cairn/internal/store"
)

// ExportChunks writes chunks of checkpoint container:seq's image, in the
// order given, to w as a chunk stream of the version given (docs/format.md,
// "Chunk stream"): see ChunkSource.Export, which serves many shares of one
// image without opening the store for each.
func (r Repo) ExportChunks(ctx context.Context, container string, seq int, w io.Writer, ids []store.ID, version int) error {
	src, err := r.OpenChunkSource(ctx, container, seq)
	if err != nil {
		return err
	}
	defer src.Close()
	return src.Export(ctx, w, ids, version)
}

// ChunkSource serves the chunks of one image, share by share, to nodes
// fetching it (Repo.OpenChunkSource). Its store stays open, so that a
// share costs the chunks it sends, not an index load.
type ChunkSource struct {
	r   Repo
	rec *Record
	st  *store.Store
	m   *store.Manifest
	of  map[store.ID]struct{}
}

// OpenChunkSource opens the store for reading the chunks of checkpoint
// container:seq. The store's index is read once, after the checkpoint is
// listed, and so holds every chunk of its image.
func (r Repo) OpenChunkSource(ctx context.Context, container string, seq int) (*ChunkSource, error) {
	rec, st, m, err := r.openManifest(ctx, container, seq)
	if err != nil {
		return nil, err
	}
	ids := m.ChunkIDs()
	of := make(map[store.ID]struct{}, len(ids))
	for _, id := range ids {
		of[id] = struct{}{}
	}
	return &ChunkSource{r: r, rec: rec, st: st, m: m, of: of}, nil
}

// ExportDelta writes the image as Repo.ExportDelta does, from the
// source's open store and manifest rather than loading and verifying them
// again: how a holder serves the head of an image (its record and
// manifest, every chunk left out) to a node about to fetch its chunks
// from the same source. The record sent is the one listed now; if the
// image was removed and taken again since the source was opened,
// ExportDelta fails with ErrNotFound.
func (c *ChunkSource) ExportDelta(ctx context.Context, w io.Writer, have func(store.ID) bool) error {
	if have == nil {
		return errors.New("export delta: no chunk set to compare against")
	}
	rec, err := c.r.Load(c.rec.Container, c.rec.Seq)
	if err != nil {
		return err
	}
	if rec.Manifest != c.rec.Manifest {
		return fmt.Errorf("%w: %s was taken again since its chunks were opened", ErrNotFound, rec.Name())
	}
	meta, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := c.st.ExportManifests(ctx, w, []*store.Manifest{c.m}, meta, store.ExportOptions{Skip: have}); err != nil {
		return c.r.corrupt(ctx, rec, err)
	}
	return nil
}

// Export writes chunks of the image, in the order given, to w as a chunk
// stream of the version given (store.ChunkStreamV1 or V2). Every id must
// be one of the image's chunks, so that a peer reads only what it names.
// The chunks are sent unverified (the receiver verifies them); one that
// cannot be read here is marked damaged in the stream and fails the
// export with a CorruptError naming the checkpoints it affects. Export may
// run concurrently with itself.
func (c *ChunkSource) Export(ctx context.Context, w io.Writer, ids []store.ID, version int) error {
	for _, id := range ids {
		if _, ok := c.of[id]; !ok {
			return fmt.Errorf("%w: chunk %s is not one of %s's", ErrNotFound, id, c.rec.Name())
		}
	}
	if err := c.st.ExportChunks(ctx, w, ids, version); err != nil {
		return c.r.corrupt(ctx, c.rec, err)
	}
	return nil
}

// Manifest is the ID of the image's manifest.
func (c *ChunkSource) Manifest() store.ID { return c.rec.Manifest }

// Close closes the store.
func (c *ChunkSource) Close() error { return c.st.Close() }

// ChunkWriter stores the chunks of one image as they arrive from several
// holders at once (Repo.OpenChunks); the record and manifest follow with
// Receive once every chunk is here.
type ChunkWriter struct {
	image string
	st    *store.Store
}

// OpenChunks opens the store for writing the chunks of checkpoint image
// (container:seq, for errors), waiting while another writer holds it.
// Close makes what was received durable.
func (r Repo) OpenChunks(ctx context.Context, image string) (*ChunkWriter, error) {
	st, err := r.OpenWriter(ctx)
	if err != nil {
		return nil, err
	}
	return &ChunkWriter{image: image, st: st}, nil
}

// Has reports whether the store holds chunk id.
func (c *ChunkWriter) Has(id store.ID) bool { return c.st.Has(id) }

// Receive reads a chunk stream that must hold exactly want, in order,
// verifying and storing each chunk; it returns how many it read. The
// chunks read before a failure stay (each was verified). Damage in the
// stream is a CorruptError. Receive may run concurrently with itself.
func (c *ChunkWriter) Receive(ctx context.Context, rd io.Reader, want []store.ID) (int, error) {
	n, err := c.st.ImportChunks(ctx, rd, want)
	if errors.Is(err, store.ErrCorrupt) {
		return n, &CorruptError{Image: c.image, What: "chunk stream", Reason: err.Error(), Err: err}
	}
	return n, err
}

// Close makes the chunks received durable and closes the store.
func (c *ChunkWriter) Close() error {
	err := c.st.Flush(context.Background())
	return errors.Join(err, c.st.Close())
}
