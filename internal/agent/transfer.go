// Images leaving the node: the chunk list, delta and whole export streams
// this agent serves to other agents and the CLI (chunkdata.go serves a
// fetch's shares; fetch.go takes them in).

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/store"
)

// chunks lists the chunk ids of a checkpoint image.
func (s *Server) chunks(w http.ResponseWriter, r *http.Request) {
	name, seq, ok := imageRef(w, r.URL.Query().Get("container"), r.URL.Query().Get("seq"))
	if !ok {
		return
	}
	ids, err := s.Manager.Repo().ChunkIDs(r.Context(), name, seq)
	if err != nil {
		failErr(w, err)
		return
	}
	out := agentv1.Chunks{IDs: make([]string, len(ids))}
	for i, id := range ids {
		out.IDs[i] = id.String()
	}
	writeJSON(w, http.StatusOK, out)
}

// exportDelta streams a checkpoint image without the chunks the caller
// has (every chunk but the ones it says it misses): a fetch's head, the
// record and manifest alone, before it asks for the chunks.
func (s *Server) exportDelta(w http.ResponseWriter, r *http.Request) {
	var req agentv1.ExportDelta
	if !rpc.DecodeLimit(w, r, &req, 64<<20) {
		return
	}
	name, seq, ok := imageRef(w, req.Container, strconv.Itoa(req.Seq))
	if !ok {
		return
	}
	ids, err := parseIDs(req.Missing)
	if err != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "missing: "+err.Error())
		return
	}
	missing := make(map[store.ID]bool, len(ids))
	for _, id := range ids {
		missing[id] = true
	}
	// The image's chunk source, kept open for the shares of its chunks
	// that follow the head (chunkdata.go): the holder opens the store
	// and loads the manifest once for both.
	src, release, err := s.sources.get(r.Context(), s.Manager.Repo(), name, seq)
	if err != nil {
		failErr(w, err)
		return
	}
	defer release()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	have := func(id store.ID) bool { return !missing[id] }
	export := func() error { return src.ExportDelta(r.Context(), w, have) }
	if req.Background {
		fg := export
		export = func() error { return inBackground(fg) }
	}
	if err := export(); err != nil {
		s.log().Warn("delta export", "ckpt", fmt.Sprintf("%s:%d", name, seq), "err", err)
	}
}

func imageRef(w http.ResponseWriter, name, seqs string) (string, int, bool) {
	seq, err := strconv.Atoi(seqs)
	if err != nil || container.ValidName(name) != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "want a container name and a checkpoint number")
		return "", 0, false
	}
	return name, seq, true
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// export streams a checkpoint to another agent or a client.
func (s *Server) export(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("container")
	seq, err := strconv.Atoi(q.Get("seq"))
	if err != nil || container.ValidName(name) != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "export needs ?container=NAME&seq=N")
		return
	}
	if _, err := s.Manager.Repo().Load(name, seq); err != nil {
		failErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	// Errors after the header can only cut the stream short; the receiver
	// verifies everything and refuses a truncated export.
	export := func() error {
		_, err := s.Manager.Repo().Export(r.Context(), name, seq, w, nil)
		return err
	}
	if q.Get("background") == "1" {
		fg := export
		export = func() error { return inBackground(fg) }
	}
	if err := export(); err != nil {
		s.log().Warn("export", "ckpt", fmt.Sprintf("%s:%d", name, seq), "err", err)
	}
}

// dropImages removes every checkpoint image of the given containers, or
// those of req.Seqs, from this node's catalog, then has their space
// reclaimed in the background.
func (s *Server) dropImages(_ context.Context, req agentv1.DropImages) (agentv1.Dropped, error) {
	var out agentv1.Dropped
	repo := s.Manager.Repo()
	var errs []error
	for _, name := range req.Containers {
		if err := container.ValidName(name); err != nil {
			return out, badRequest(err)
		}
		recs, _ := repo.List(name)
		for _, rec := range recs {
			if len(req.Seqs) > 0 && !slices.Contains(req.Seqs, rec.Seq) {
				continue
			}
			if err := repo.Remove(name, rec.Seq); err != nil && !errors.Is(err, image.ErrNotFound) {
				errs = append(errs, err)
				continue
			}
			out.Images++
		}
	}
	if out.Images > 0 {
		s.reclaim.kick(repo, s.log())
	}
	return out, errors.Join(errs...)
}

// parseIDs parses chunk ids in hex.
func parseIDs(hexIDs []string) ([]store.ID, error) {
	ids := make([]store.ID, len(hexIDs))
	for i, x := range hexIDs {
		id, err := store.ParseID(x)
		if err != nil {
			return nil, err
		}
		ids[i] = id
	}
	return ids, nil
}
