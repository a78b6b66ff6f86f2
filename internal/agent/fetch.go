// Images coming to the node: fetches from their holders (chunkdata.go and
// transfer.go serve the other end).

package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/store"
)

// How a fetch shares out the chunks it lacks among an image's holders:
// shares of fetchShare chunks (4 MiB of memory pages), fetchStreams
// shares in flight per holder, so that the sender's reads, the wire and
// the receiver's verification overlap and use more than one core on
// either side.
const (
	fetchShare   = 1024
	fetchStreams = 2
)

// fetch copies an image from other agents unless it is here already.
// With req.Repair, an image that is here is read in full first, and what
// of it is damaged is set aside and fetched again.
//
// The chunks this node lacks come from every holder at once (req.From and
// req.Also): each holder's streams take the next share of the chunk list
// as they finish one, so a faster holder sends more; a holder that fails
// or serves damage is given up and its unfinished share goes to the
// others. Every chunk is verified as it arrives. The record and manifest
// (the image's head) come first, from the first holder that sends a good
// one, and are checked against req before any chunk is asked for; they
// are stored last, once every chunk is here, and only then is the image
// listed.
func (s *Server) fetch(ctx context.Context, req agentv1.Fetch) (agentv1.Image, error) {
	start := time.Now()
	holders := append([]agentv1.Holder{{Addr: req.From, Node: req.FromNode}}, req.Also...)
	errs := []error{names.Container(req.Container), names.Seq(req.Seq)}
	for _, h := range holders {
		errs = append(errs, names.Node(h.Node))
	}
	if err := errors.Join(errs...); err != nil {
		return agentv1.Image{}, badRequest(err)
	}
	repo := s.Manager.Repo()
	var damage image.Damage
	if rec, err := repo.Load(req.Container, req.Seq); err == nil {
		if !req.Repair {
			return agentv1.Image{Checkpoint: checkpointWire(rec)}, nil
		}
		if damage, err = repo.SetAsideDamaged(ctx, req.Container, req.Seq); err != nil {
			return agentv1.Image{}, fmt.Errorf("check %s:%d: %w", req.Container, req.Seq, err)
		}
		if !damage.Any() {
			return agentv1.Image{Checkpoint: checkpointWire(rec)}, nil
		}
		s.log().Warn("damaged image; fetching the damaged parts again", "ckpt", rec.Name(),
			"chunks", damage.Chunks, "manifest", damage.Manifest, "peer", req.FromNode)
	}
	f := &fetcher{s: s, req: req, limit: newRateLimit(req.Rate), image: fmt.Sprintf("%s:%d", req.Container, req.Seq)}
	f.background.Store(req.Background)
	if !req.Repair {
		// One fetch of an image at a time on a node: a second one waits
		// for the first (which holds the store's writer anyway), and a
		// restart waiting behind a replication lifts its rate limit and
		// low priority.
		other, done := s.fetches.begin(f)
		if other != nil {
			if !req.Background {
				other.promote()
			}
			select {
			case <-other.finished:
			case <-ctx.Done():
				return agentv1.Image{}, ctx.Err()
			}
			img, err := s.fetch(ctx, req) // here now, or fetched by this call
			if err == nil && !img.Fetched {
				img.Duration = time.Since(start) // the wait
			}
			return img, err
		}
		defer done()
	}
	for _, h := range holders {
		f.holders = append(f.holders, &holder{Holder: h, c: rpc.NewAgentClient(h.Addr, h.Node, s.Creds)})
	}
	defer f.close()
	rec, err := f.run(ctx)
	if err != nil {
		return agentv1.Image{}, err
	}
	s.failpoint(ctx, "fetched") // listed here, not yet known to the coordinator
	img := agentv1.Image{Checkpoint: checkpointWire(rec), Fetched: true, Duration: time.Since(start),
		Repaired: damage.Chunks, RepairedManifest: damage.Manifest}
	for _, h := range f.holders {
		sh := h.share()
		img.Bytes += sh.Bytes
		img.Holders = append(img.Holders, sh)
	}
	return img, nil
}

// fetcher is one fetch of an image from its holders.
type fetcher struct {
	s       *Server
	req     agentv1.Fetch
	image   string // container:seq
	holders []*holder
	limit   *rateLimit // shared by all streams
	// background: at the lowest priority on both nodes (req.Background,
	// until a restart that waits for this fetch promotes it).
	background atomic.Bool
	finished   chan struct{} // closed when the fetch ends (fetches)
}

// promote makes a background fetch go on at full speed and priority:
// a restart waits for it.
func (f *fetcher) promote() {
	if f.background.Swap(false) {
		f.s.log().Info("fetch promoted: a restart waits for it", "ckpt", f.image)
	}
	f.limit.lift()
}

// fetches are the image fetches running on the node, by image.
type fetches struct {
	mu sync.Mutex
	m  map[string]*fetcher
}

// begin registers f as the fetch of its image, unless one runs already:
// then it returns that one, to wait for. done ends f's registration.
func (fs *fetches) begin(f *fetcher) (other *fetcher, done func()) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if o := fs.m[f.image]; o != nil {
		return o, nil
	}
	if fs.m == nil {
		fs.m = map[string]*fetcher{}
	}
	f.finished = make(chan struct{})
	fs.m[f.image] = f
	return nil, func() {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		delete(fs.m, f.image)
		close(f.finished)
	}
}

func (f *fetcher) close() {
	for _, h := range f.holders {
		h.c.Close()
	}
}

// errs joins why every holder was given up.
func (f *fetcher) errs() error {
	var errs []error
	for _, h := range f.holders {
		if err := h.failed(); err != nil {
			errs = append(errs, fmt.Errorf("from %s: %w", h.Node, err))
		}
	}
	return errors.Join(errs...)
}

func (f *fetcher) run(ctx context.Context) (*image.Record, error) {
	head, h, err := f.head(ctx)
	if err != nil {
		return nil, err
	}
	ids := h.Manifest.ChunkIDs()
	// Twice at most: a gc here between the fetch and the Receive (which
	// checks every chunk is here) may have taken chunks back.
	for try := 0; ; try++ {
		missing, err := f.s.Manager.Repo().Missing(ctx, ids)
		if err != nil {
			return nil, err
		}
		if len(missing) > 0 {
			if err := f.fetchChunks(ctx, missing); err != nil {
				return nil, err
			}
			f.s.failpoint(ctx, "fetch-chunks") // every chunk here, the image not yet listed
		}
		receive := func() (err error) {
			_, err = f.s.Manager.Repo().Receive(ctx, bytes.NewReader(head), f.req.Container, f.req.Seq, nil)
			return err
		}
		if f.background.Load() {
			err = inBackground(receive)
		} else {
			err = receive()
		}
		if err == nil || !errors.Is(err, store.ErrNotFound) || try == 1 {
			if err != nil {
				return nil, fmt.Errorf("fetch %s: %w", f.image, err)
			}
			return f.s.Manager.Repo().Load(f.req.Container, f.req.Seq)
		}
	}
}

// head fetches the image's record and manifest, as a delta stream that
// leaves out every chunk, from the first holder that sends a good one,
// and checks it (image.ReadHead) before any chunk is asked for. It
// returns the stream, for Receive once the chunks are here, and what it
// says.
func (f *fetcher) head(ctx context.Context) ([]byte, *image.Head, error) {
	for _, h := range f.holders {
		body, err := h.c.ExportDelta(ctx, agentv1.ExportDelta{Container: f.req.Container, Seq: f.req.Seq, Missing: []string{}, Background: f.background.Load()})
		if err != nil {
			h.giveUp(err)
			continue
		}
		var buf bytes.Buffer
		_, err = io.Copy(&buf, io.LimitReader(body, maxHead))
		body.Close()
		h.add(0, int64(buf.Len()))
		if err == nil {
			var head *image.Head
			if head, err = image.ReadHead(bytes.NewReader(buf.Bytes()), f.req.Container, f.req.Seq); err == nil {
				return buf.Bytes(), head, nil
			}
		}
		h.giveUp(err)
	}
	return nil, nil, fmt.Errorf("fetch %s: %w", f.image, f.errs())
}

// maxHead bounds the head of an image's export stream: its record and
// manifest (32 bytes a chunk: 16 MiB for a 2 GiB image of pages).
const maxHead = store.MaxExportMetaSize + store.MaxManifestSize + 64

// fetchChunks fetches the chunks missing here from every holder still up,
// in shares (see fetch).
func (f *fetcher) fetchChunks(ctx context.Context, missing []store.ID) (err error) {
	cw, err := f.s.Manager.Repo().OpenChunks(ctx, f.image)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cw.Close()) }()
	q := newShareQueue(missing, fetchShare)
	var wg sync.WaitGroup
	for _, h := range f.holders {
		if h.failed() != nil {
			continue
		}
		for range fetchStreams {
			wg.Go(func() {
				for h.failed() == nil {
					ids, ok := q.next()
					if !ok {
						return
					}
					n, err := f.fetchShare(ctx, h, cw, ids)
					q.done(ids[n:])
					if err != nil {
						f.s.log().Warn("fetch: holder given up; its share goes to the others", "ckpt", f.image, "peer", h.Node, "err", err)
						h.giveUp(err)
					}
				}
			})
		}
	}
	wg.Wait()
	if left := q.left(); left > 0 {
		return fmt.Errorf("fetch %s: %d chunks fetched from no holder: %w", f.image, left, f.errs())
	}
	return nil
}

// fetchShare fetches one share from h into cw and returns how many of its
// chunks arrived, verified.
func (f *fetcher) fetchShare(ctx context.Context, h *holder, cw *image.ChunkWriter, ids []store.ID) (int, error) {
	bg := f.background.Load()
	req := agentv1.ChunkData{Container: f.req.Container, Seq: f.req.Seq, IDs: make([]string, len(ids)), Background: bg, Version: store.ChunkStreamV2}
	for i, id := range ids {
		req.IDs[i] = id.String()
	}
	body, err := h.c.ChunkData(ctx, req)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	cr := &countingReader{r: f.limit.reader(ctx, body)}
	var n int
	receive := func() error {
		n, err = cw.Receive(ctx, cr, ids)
		return err
	}
	if bg {
		err = inBackground(receive)
	} else {
		err = receive()
	}
	h.add(n, cr.n)
	return n, err
}
