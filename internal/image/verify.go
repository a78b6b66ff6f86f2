package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/cairn-hpc/cairn/internal/store"
)

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
	if err := checkShape(m, rec.FilesOnly); err != nil {
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
