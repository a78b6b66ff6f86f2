package agent

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/cairn-hpc/cairn/internal/image"
)

// reclaimWithin bounds one reclaim pass.
const reclaimWithin = 2 * time.Minute

// reclaimer gives back the store's space after the coordinator drops
// images from this node (retention, a removed job): the chunks and
// manifests no listed image uses any more are deleted, so that the store
// holds exactly what the catalog lists. One pass at a time, at idle
// priority, after the drop has answered; drops during a pass ask for one
// more after it.
type reclaimer struct {
	mu      sync.Mutex
	running bool
	again   bool
}

// kick asks for a pass over repo.
func (r *reclaimer) kick(repo image.Repo, log *slog.Logger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		r.again = true
		return
	}
	r.running = true
	go r.loop(repo, log)
}

func (r *reclaimer) loop(repo image.Repo, log *slog.Logger) {
	for {
		err := inBackground(func() error {
			// Every listed image is kept: only what none uses goes. A
			// checkpoint being written holds the store, which gc waits for.
			// Bounded: gc waits for readers (a lazy restore's pages)
			// before it deletes packs, and holds the store meanwhile; a
			// pass given up on changes nothing, and the next drop asks again.
			ctx, cancel := context.WithTimeout(context.Background(), reclaimWithin)
			defer cancel()
			res, err := repo.GC(ctx, image.GCOptions{Keep: math.MaxInt})
			if err == nil && (res.Store.ChunksRemoved > 0 || res.Store.ManifestsRemoved > 0) {
				log.Info("store reclaimed", "manifests", res.Store.ManifestsRemoved, "chunks", res.Store.ChunksRemoved,
					"bytes", res.Store.BytesBefore-res.Store.BytesAfter)
			}
			return err
		})
		if err != nil {
			log.Warn("store reclaim", "err", err)
		}
		r.mu.Lock()
		if !r.again {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.again = false
		r.mu.Unlock()
	}
}
