package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/store"
)

// holderSource prepares a restore of checkpoint container:seq, which this
// node does not hold, from its holders (what: "lazy restore" or "restore
// from the stream", for the log): the head first, from the first holder
// that sends a good one, then chunks as the restore and the page server
// ask for them (lazyChunks), which the caller closes.
func (s *Server) holderSource(ctx context.Context, what, container string, seq int, holders []agentv1.Holder) (*image.Head, *lazyChunks, error) {
	if len(holders) == 0 {
		return nil, nil, badRequest(errors.New("a lazy restore needs at least one holder of the image"))
	}
	f := &fetcher{s: s, req: agentv1.Fetch{Container: container, Seq: seq}, image: fmt.Sprintf("%s:%d", container, seq)}
	for _, h := range holders {
		f.holders = append(f.holders, &holder{Holder: h, c: rpc.NewAgentClient(h.Addr, h.Node, s.Creds)})
	}
	_, head, err := f.head(ctx)
	if err != nil {
		f.close()
		return nil, nil, err
	}
	return head, s.lazyChunks(&holderChunks{f: f, what: what}), nil
}

// lazyChunks returns the chunks of an image a lazy restore asks for: from
// this node's store if it has them (chunks of the rank's earlier
// checkpoints), else from remote.
func (s *Server) lazyChunks(remote remoteChunks) *lazyChunks {
	lc := &lazyChunks{remote: remote}
	if st, err := s.Manager.Repo().OpenReader(); err == nil {
		lc.local = st
	}
	return lc
}

// lazyChunks gets the chunks of an image a lazy restore asks for: from
// this node's store if it has them, else from remote. Every chunk is
// verified as it arrives.
type lazyChunks struct {
	remote remoteChunks
	local  *store.Store // nil: no store here yet
	once   sync.Once
}

// remoteChunks is where a lazy restore gets the chunks this node lacks:
// the image's holders (holderChunks) or the durable tier (tierChunks).
type remoteChunks interface {
	// get hands keep each of ids, verified, once, from any goroutine.
	get(ctx context.Context, ids []store.ID, keep func(store.ID, []byte) error) error
	// done is called once every page of the image is here.
	done(image string)
	close()
}

// holderChunks gets chunks from an image's holders. A request is shared
// out among the holders still serving (lazyShare chunks or more each,
// fetched at once); a holder that fails or serves damage is given up and
// its share fetched from the next.
type holderChunks struct {
	f    *fetcher
	what string // the restore, for the log
	next atomic.Uint32
}

func (c *holderChunks) close() { c.f.close() }

// lazyShare is the least a holder is asked for at once.
const lazyShare = 64

// lazyWindow bounds the chunks one GetSeq holds in memory at a time.
const lazyWindow = 1024

func (c *lazyChunks) close() {
	c.once.Do(func() {
		c.remote.close()
		if c.local != nil {
			c.local.Close()
		}
	})
}

func (c *lazyChunks) GetSeq(ctx context.Context, ids []store.ID, fn func(data []byte) error) error {
	for len(ids) > 0 {
		w := ids[:min(len(ids), lazyWindow)]
		ids = ids[len(w):]
		data, err := c.get(ctx, w)
		if err != nil {
			return err
		}
		for _, d := range data {
			if err := fn(d); err != nil {
				return err
			}
		}
	}
	return nil
}

// get returns the contents of ids, in order.
func (c *lazyChunks) get(ctx context.Context, ids []store.ID) ([][]byte, error) {
	data := make([][]byte, len(ids))
	at := map[store.ID][]int{}
	var remote []store.ID
	for i, id := range ids {
		if c.local != nil && c.local.Has(id) {
			if b, err := c.local.Get(ctx, id); err == nil {
				data[i] = b
				continue
			}
		}
		if at[id] == nil {
			remote = append(remote, id)
		}
		at[id] = append(at[id], i)
	}
	if len(remote) == 0 {
		return data, nil
	}
	var mu sync.Mutex
	err := c.remote.get(ctx, remote, func(id store.ID, b []byte) error {
		mu.Lock()
		defer mu.Unlock()
		for _, i := range at[id] {
			data[i] = b
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return data, nil
}

func (c *holderChunks) get(ctx context.Context, remote []store.ID, keep func(store.ID, []byte) error) error {
	live := 0
	for _, h := range c.f.holders {
		if h.failed() == nil {
			live++
		}
	}
	parts := max(1, min(live, len(remote)/lazyShare))
	size := (len(remote) + parts - 1) / parts
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for p := range parts {
		part := remote[p*size : min(len(remote), (p+1)*size)]
		first := int(c.next.Add(1))
		wg.Go(func() { errs[p] = c.fetch(ctx, part, first, keep) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// fetch fetches part from the holders, starting with holder first (mod
// their number) and going on to the next when one fails.
func (c *holderChunks) fetch(ctx context.Context, part []store.ID, first int, keep func(store.ID, []byte) error) error {
	hs := c.f.holders
	for k := range hs {
		if len(part) == 0 {
			return nil
		}
		h := hs[(first+k)%len(hs)]
		if h.failed() != nil {
			continue
		}
		req := agentv1.ChunkData{Container: c.f.req.Container, Seq: c.f.req.Seq, IDs: make([]string, len(part)), Version: store.ChunkStreamV2}
		for i, id := range part {
			req.IDs[i] = id.String()
		}
		body, err := h.c.ChunkData(ctx, req)
		n := 0
		if err == nil {
			cr := &countingReader{r: body}
			n, err = store.ReadChunks(ctx, cr, part, keep)
			body.Close()
			h.add(n, cr.n)
		}
		part = part[n:]
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if h.failed() == nil {
			c.f.s.log().Warn(c.what+": holder given up; its pages come from the others", "ckpt", c.f.image, "peer", h.Node, "err", err)
		}
		h.giveUp(err)
	}
	if len(part) > 0 {
		return fmt.Errorf("%s of %s: %d chunks from no holder: %w", c.what, c.f.image, len(part), c.f.errs())
	}
	return nil
}

// lazyRestore is the container.Lazy of a rank restored lazily from
// holders (RankRestore.Lazy) or from the durable tier (RankRestore.Tier),
// and what to call if the restore fails before it starts.
func (s *Server) lazyRestore(ctx context.Context, name string, req agentv1.RankRestore) (*container.Lazy, func(), error) {
	var head *image.Head
	var lc *lazyChunks
	var err error
	if req.Tier != nil {
		head, lc, err = s.lazyTierSource(ctx, name, req.Seq, *req.Tier)
	} else {
		head, lc, err = s.holderSource(ctx, "lazy restore", name, req.Seq, req.Lazy)
	}
	if err != nil {
		return nil, nil, err
	}
	return &container.Lazy{Head: head, Chunks: lc, Done: func(st container.LazyStats, err error) {
		defer lc.close()
		if err != nil {
			s.log().Error("lazy restore failed", "ckpt", head.Record.Name(), "err", err)
			return
		}
		s.log().Info("lazy restore: every page is here", "ckpt", head.Record.Name(), "pages", st.Pages, "took", st.Took)
		lc.remote.done(head.Record.Name())
	}}, lc.close, nil
}

// done repairs the copies of holders that served damage.
func (c *holderChunks) done(image string) { c.repairDamaged(image) }

// repairDamaged asks every holder that served damage to repair its copy
// from a holder that served without fault.
func (c *holderChunks) repairDamaged(image string) {
	var good *holder
	var damaged []*holder
	for _, h := range c.f.holders {
		sh := h.share()
		switch {
		case sh.Damaged:
			damaged = append(damaged, h)
		case sh.Error == "" && good == nil:
			good = h
		}
	}
	if good == nil {
		return
	}
	for _, h := range damaged {
		req := agentv1.Fetch{Container: c.f.req.Container, Seq: c.f.req.Seq, From: good.Addr, FromNode: good.Node, Repair: true}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		img, err := h.c.Fetch(ctx, req)
		cancel()
		if err != nil {
			c.f.s.log().Warn("lazy restore: repair of a damaged copy failed", "ckpt", image, "peer", h.Node, "from", good.Node, "err", err)
			continue
		}
		c.f.s.log().Info("lazy restore: damaged copy repaired", "ckpt", image, "peer", h.Node, "from", good.Node, "chunks", img.Repaired)
	}
}

// streamed logs which holders sent a rank restored from the stream and
// returns what each sent: the coordinator has those that served damage
// repaired.
func (s *Server) streamed(image string, lc *lazyChunks) []agentv1.HolderShare {
	var from []string
	var bytes int64
	var shares []agentv1.HolderShare
	if hc, ok := lc.remote.(*holderChunks); ok {
		for _, h := range hc.f.holders {
			sh := h.share()
			shares = append(shares, sh)
			if sh.Bytes > 0 {
				from = append(from, sh.Node)
				bytes += sh.Bytes
			}
		}
	}
	s.log().Info("restored from the stream", "ckpt", image, "peer", strings.Join(from, ","), "bytes", bytes)
	return shares
}
