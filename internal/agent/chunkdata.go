// Chunk data served to other agents fetching an image from this node
// (fetch.go is the other end), from sources kept open between shares.

package agent

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/store"
)

// chunkData streams chunks of an image to another agent fetching it.
func (s *Server) chunkData(w http.ResponseWriter, r *http.Request) {
	var req agentv1.ChunkData
	if !rpc.DecodeLimit(w, r, &req, 8<<20) {
		return
	}
	name, seq, ok := imageRef(w, req.Container, strconv.Itoa(req.Seq))
	if !ok {
		return
	}
	if len(req.IDs) > store.MaxStreamChunks {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, fmt.Sprintf("at most %d chunks per request", store.MaxStreamChunks))
		return
	}
	ids, err := parseIDs(req.IDs)
	if err != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "ids: "+err.Error())
		return
	}
	version := max(req.Version, store.ChunkStreamV1)
	if version > store.ChunkStreamV2 {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, fmt.Sprintf("chunk stream version %d is not known here", req.Version))
		return
	}
	if s.sources.requests.Add(1) > 1 {
		s.failpoint(r.Context(), "chunk-data") // every share but the first
	}
	src, release, err := s.sources.get(r.Context(), s.Manager.Repo(), name, seq)
	if err != nil {
		failErr(w, err)
		return
	}
	defer release()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	export := func() error { return src.Export(r.Context(), w, ids, version) }
	if req.Background {
		fg := export
		export = func() error { return inBackground(fg) }
	}
	// Errors after the header cut the stream short or mark a damaged
	// chunk in it; the receiver verifies everything.
	if err := export(); err != nil {
		s.log().Warn("chunk export", "ckpt", fmt.Sprintf("%s:%d", name, seq), "err", err)
	}
}

// chunkSources keeps the chunk sources of images being fetched from this
// node open between their shares, and closes each once unused for
// sourceIdle.
type chunkSources struct {
	mu       sync.Mutex
	m        map[string]*chunkSource
	requests atomic.Int64 // shares served, for the chunk-data failpoint
}

type chunkSource struct {
	src   *image.ChunkSource
	users int
	idle  *time.Timer
}

const sourceIdle = 10 * time.Second

// get returns the open source of container:seq, opening it if need be,
// and the function to call once done with it.
func (c *chunkSources) get(ctx context.Context, repo image.Repo, container string, seq int) (*image.ChunkSource, func(), error) {
	key := fmt.Sprintf("%s:%d", container, seq)
	rec, err := repo.Load(container, seq)
	if err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	e := c.m[key]
	if e != nil && e.src.Manifest() != rec.Manifest {
		// Not the image cached under that name (removed and taken
		// again): serve this share from a source of its own.
		c.mu.Unlock()
		src, err := repo.OpenChunkSource(ctx, container, seq)
		if err != nil {
			return nil, nil, err
		}
		return src, func() { src.Close() }, nil
	}
	if e == nil {
		c.mu.Unlock()
		src, err := repo.OpenChunkSource(ctx, container, seq)
		if err != nil {
			return nil, nil, err
		}
		c.mu.Lock()
		if e = c.m[key]; e != nil {
			src.Close() // opened meanwhile by another share
		} else {
			e = &chunkSource{src: src}
			if c.m == nil {
				c.m = map[string]*chunkSource{}
			}
			c.m[key] = e
		}
	}
	e.users++
	if e.idle != nil {
		e.idle.Stop()
	}
	c.mu.Unlock()
	release := sync.OnceFunc(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if e.users--; e.users == 0 {
			e.idle = time.AfterFunc(sourceIdle, func() {
				c.mu.Lock()
				defer c.mu.Unlock()
				if e.users == 0 && c.m[key] == e {
					delete(c.m, key)
					e.src.Close()
				}
			})
		}
	})
	return e.src, release, nil
}

// closeAll closes every source, when the server stops.
func (c *chunkSources) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, e := range c.m {
		if e.idle != nil {
			e.idle.Stop()
		}
		e.src.Close()
		delete(c.m, key)
	}
}
