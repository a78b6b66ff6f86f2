// The durable tier (api/agent/v1/tier.go): this node's images flushed to
// it and fetched from it, and the records of global checkpoints the
// coordinator has this agent write, read and prune. The tier is opened
// per request with this agent's own credentials (its environment); the
// URL carries none.

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/tier"
)

// openTier opens the tier's repo at url.
func openTier(ctx context.Context, url string) (*tier.Repo, error) {
	b, prefix, err := tier.Open(ctx, url)
	if err != nil {
		return nil, tierErr(err)
	}
	r, err := tier.OpenRepo(ctx, b, prefix)
	if err != nil {
		return nil, tierErr(err)
	}
	return r, nil
}

// tierErr gives an error of the tier the code that says what to do about
// it, keeping its whole message; other errors (a damaged local image, a
// missing one) are left to failErr.
func tierErr(err error) error {
	code := ""
	switch {
	case errors.Is(err, tier.ErrCorrupt):
		code = agentv1.CodeCorrupt
	case errors.Is(err, tier.ErrNotExist):
		code = agentv1.CodeNotFound
	case errors.Is(err, tier.ErrDenied):
		code = agentv1.CodeForbidden
	case errors.Is(err, tier.ErrUnreachable):
		code = agentv1.CodeTierUnreachable
	default:
		return err
	}
	return &agentv1.Error{Code: code, Message: err.Error()}
}

func checkImageRef(ref agentv1.ImageRef) error {
	if err := container.ValidName(ref.Container); err != nil {
		return badRequest(err)
	}
	if err := names.Seq(ref.Seq); err != nil {
		return badRequest(err)
	}
	return nil
}

// tierFlush uploads images of this node into the tier, one after the
// other (each flush uploads its packs in parallel).
func (s *Server) tierFlush(ctx context.Context, req agentv1.TierFlush) (agentv1.TierFlushed, error) {
	var out agentv1.TierFlushed
	for _, ref := range req.Images {
		if err := checkImageRef(ref); err != nil {
			return out, err
		}
	}
	tr, err := openTier(ctx, req.URL)
	if err != nil {
		return out, err
	}
	for _, ref := range req.Images {
		start := time.Now()
		rec, st, err := s.Manager.Repo().FlushToTier(ctx, tr, ref.Container, ref.Seq)
		if err != nil {
			return out, tierErr(fmt.Errorf("flush %s:%d to %s: %w", ref.Container, ref.Seq, tr, err))
		}
		raw, err := json.Marshal(rec)
		if err != nil {
			return out, err
		}
		out.Images = append(out.Images, agentv1.TierImage{ImageRef: ref, Manifest: rec.Manifest.String(), Record: raw,
			Chunks: st.Chunks, NewChunks: st.NewChunks, Bytes: st.Bytes, Duration: time.Since(start)})
		s.log().Info("flushed to the durable tier", "ckpt", rec.Name(), "tier", tr.String(), "new_chunks", st.NewChunks, "bytes", st.Bytes)
	}
	return out, nil
}

// tierFetch brings an image from the tier into this node's store.
func (s *Server) tierFetch(ctx context.Context, req agentv1.TierFetch) (agentv1.Image, error) {
	var out agentv1.Image
	if err := checkImageRef(req.ImageRef); err != nil {
		return out, err
	}
	tr, err := openTier(ctx, req.URL)
	if err != nil {
		return out, err
	}
	start := time.Now()
	repo := s.Manager.Repo()
	_, missing := repo.Load(req.Container, req.Seq)
	rec, st, err := repo.FetchFromTier(ctx, tr, req.Record, req.Container, req.Seq)
	if err != nil {
		return out, tierErr(fmt.Errorf("fetch %s:%d from %s: %w", req.Container, req.Seq, tr, err))
	}
	s.log().Info("fetched from the durable tier", "ckpt", rec.Name(), "tier", tr.String(), "new_chunks", st.NewChunks, "bytes", st.Bytes)
	return agentv1.Image{Checkpoint: checkpointWire(rec), Fetched: missing != nil, Bytes: st.Bytes, Duration: time.Since(start)}, nil
}

// tierRecord writes the record of a global checkpoint into the tier.
func (s *Server) tierRecord(ctx context.Context, req agentv1.TierRecord) error {
	if err := names.Seq(req.Seq); err != nil {
		return badRequest(err)
	}
	if !json.Valid(req.Data) {
		return badRequest(errors.New("record: not JSON"))
	}
	tr, err := openTier(ctx, req.URL)
	if err != nil {
		return err
	}
	return tierErr(tr.PutRecord(ctx, req.Seq, req.Data))
}

// tierRead reads the record of a global checkpoint from the tier, the
// newest one if req.Seq is 0.
func (s *Server) tierRead(ctx context.Context, req agentv1.TierRead) (agentv1.TierRecord, error) {
	out := agentv1.TierRecord{Seq: req.Seq}
	tr, err := openTier(ctx, req.URL)
	if err != nil {
		return out, err
	}
	if out.Seq == 0 {
		seqs, err := tr.Records(ctx)
		if err != nil {
			return out, tierErr(err)
		}
		if len(seqs) == 0 {
			return out, &agentv1.Error{Code: agentv1.CodeNotFound, Message: fmt.Sprintf("%s holds no checkpoint", tr)}
		}
		out.Seq = seqs[len(seqs)-1]
	}
	data, err := tr.Record(ctx, out.Seq)
	if err != nil {
		return out, tierErr(err)
	}
	out.Data = data
	return out, nil
}

// tierPrune deletes from the tier the records and images no longer kept.
func (s *Server) tierPrune(ctx context.Context, req agentv1.TierPrune) (agentv1.TierPruned, error) {
	var out agentv1.TierPruned
	var keep []store.ID
	for _, m := range req.Manifests {
		id, err := store.ParseID(m)
		if err != nil {
			return out, badRequest(fmt.Errorf("manifest %q: %w", m, err))
		}
		keep = append(keep, id)
	}
	tr, err := openTier(ctx, req.URL)
	if err != nil {
		return out, err
	}
	seqs, err := tr.Records(ctx)
	if err != nil {
		return out, tierErr(err)
	}
	for _, seq := range seqs {
		if slices.Contains(req.Records, seq) {
			continue
		}
		if err := tr.DeleteRecord(ctx, seq); err != nil {
			return out, tierErr(err)
		}
		out.Records++
	}
	st, err := tr.Prune(ctx, keep)
	out.Manifests, out.Packs, out.Bytes = st.Manifests, st.Packs, st.Bytes
	return out, tierErr(err)
}

// lazyTierSource prepares a lazy restore of checkpoint container:seq from
// the durable tier: the head first (its record, checked as a fetch checks
// it, and its manifest), then chunks as the restore and the page server
// ask for them (tierChunks).
func (s *Server) lazyTierSource(ctx context.Context, container string, seq int, src agentv1.TierSource) (*image.Head, *lazyChunks, error) {
	tr, err := openTier(ctx, src.URL)
	if err != nil {
		return nil, nil, err
	}
	head, err := s.Manager.Repo().TierHead(ctx, tr, src.Record, container, seq)
	if err != nil {
		return nil, nil, tierErr(fmt.Errorf("lazy restore of %s:%d from %s: %w", container, seq, tr, err))
	}
	return head, s.lazyChunks(&tierChunks{tr: tr, log: s.log(), start: time.Now()}), nil
}

// tierChunks gets the chunks of a lazy restore from the durable tier, by
// ranges of its packs, each verified (tier.Repo.Get).
type tierChunks struct {
	tr    *tier.Repo
	log   *slog.Logger
	start time.Time
	read  atomic.Int64
}

func (c *tierChunks) get(ctx context.Context, ids []store.ID, keep func(store.ID, []byte) error) error {
	n, err := c.tr.Get(ctx, ids, keep)
	c.read.Add(n)
	return tierErr(err)
}

func (c *tierChunks) done(image string) {
	c.log.Info("lazy restore: read from the durable tier", "ckpt", image, "tier", c.tr.String(), "bytes", c.read.Load(), "took", time.Since(c.start))
}

func (c *tierChunks) close() {}
