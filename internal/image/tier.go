package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/tier"
)

// FlushToTier uploads checkpoint container:seq into the tier's repo tr:
// the chunks tr lacks, then the manifest (tier.Repo.Flush). It returns
// the checkpoint's record, which a restore from the tier hands back to
// FetchFromTier: the caller keeps it with the tier's record of the global
// checkpoint, written after every image is flushed.
func (r Repo) FlushToTier(ctx context.Context, tr *tier.Repo, container string, seq int) (*Record, tier.FlushStats, error) {
	rec, err := r.Load(container, seq)
	if err != nil {
		return nil, tier.FlushStats{}, err
	}
	st, err := r.OpenReader()
	if err != nil {
		return nil, tier.FlushStats{}, err
	}
	defer st.Close()
	stats, err := tr.Flush(ctx, st, rec.Manifest)
	if errors.Is(err, store.ErrCorrupt) {
		return nil, stats, &CorruptError{Image: rec.Name(), What: "chunk", Reason: err.Error(), Err: err}
	}
	return rec, stats, err
}

// TierHead reads the head of checkpoint container:seq in the tier's repo
// tr: its manifest, and its record meta as the tier's record of the global
// checkpoint gives it. meta is hostile input, checked as Receive checks an
// export stream's: it must name container:seq and a manifest the tier
// holds, the manifest must have the shape a restore needs, and the config
// must pass CheckConfig. Damage is a CorruptError.
func (r Repo) TierHead(ctx context.Context, tr *tier.Repo, meta []byte, container string, seq int) (*Head, error) {
	if err := checkRef(container, seq); err != nil {
		return nil, fmt.Errorf("read from %s: %w", tr, err)
	}
	name := fmt.Sprintf("%s:%d", container, seq)
	corrupt := func(what, reason string, err error) error {
		return &CorruptError{Image: name, What: what, Reason: reason, Err: err}
	}
	// The record names its manifest: the manifest is read (and verified
	// by its name) to check the record against it, as an export stream's.
	var probe struct {
		Manifest store.ID `json:"manifest"`
	}
	if err := json.Unmarshal(meta, &probe); err != nil {
		return nil, corrupt("record", err.Error(), err)
	}
	man, err := tr.LoadManifest(ctx, probe.Manifest)
	if errors.Is(err, tier.ErrCorrupt) {
		return nil, corrupt("manifest "+probe.Manifest.Short(), err.Error(), err)
	}
	if err != nil {
		return nil, err
	}
	var rec Record
	if err := checkImported(meta, []store.ID{probe.Manifest}, []*store.Manifest{man}, &imageRef{container, seq}, &rec); err != nil {
		return nil, corrupt("record", err.Error(), err)
	}
	if r.CheckConfig != nil {
		if err := r.CheckConfig(rec.Config); err != nil {
			return nil, corrupt("record", "config: "+err.Error(), err)
		}
	}
	rec.Pinned = false
	return &Head{Record: &rec, Manifest: man}, nil
}

// FetchFromTier brings checkpoint container:seq from the tier's repo tr
// into this repo, its record meta checked first (TierHead) and before any
// chunk is fetched. Every chunk is verified as it comes (tier.Repo.Fetch);
// a damaged object fails the fetch with an error matching ErrCorrupt, and
// nothing is listed. A checkpoint of that name and number already here is
// left as it is and returned.
func (r Repo) FetchFromTier(ctx context.Context, tr *tier.Repo, meta []byte, container string, seq int) (*Record, tier.FetchStats, error) {
	if err := checkRef(container, seq); err != nil {
		return nil, tier.FetchStats{}, fmt.Errorf("fetch from %s: %w", tr, err)
	}
	if have, err := r.Load(container, seq); err == nil {
		return have, tier.FetchStats{}, nil
	}
	head, err := r.TierHead(ctx, tr, meta, container, seq)
	if err != nil {
		return nil, tier.FetchStats{}, err
	}
	st, err := r.OpenWriter(ctx)
	if err != nil {
		return nil, tier.FetchStats{}, err
	}
	defer st.Close()
	rec := head.Record
	stats, err := tr.Fetch(ctx, st, rec.Manifest)
	if errors.Is(err, tier.ErrCorrupt) || errors.Is(err, store.ErrCorrupt) {
		return nil, stats, &CorruptError{Image: rec.Name(), What: "chunk", Reason: err.Error(), Err: err}
	}
	if err != nil {
		return nil, stats, err
	}
	if err := r.saveRecord(rec); err != nil {
		return nil, stats, err
	}
	return rec, stats, nil
}
