package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"cairn/internal/store"
	"cairn/internal/store/tier"
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

// FetchFromTier brings checkpoint container:seq from the tier's repo tr
// into this repo. meta is its record as the tier's record of the global
// checkpoint gives it: hostile input, checked as Receive checks an export
// stream's, and before any chunk is fetched: it must name container:seq
// and a manifest the tier holds, the manifest must have the shape a
// restore needs, and the config must pass CheckConfig. Every chunk is
// verified as it comes (tier.Repo.Fetch); a damaged object fails the
// fetch with an error matching ErrCorrupt, and nothing is listed. A
// checkpoint of that name and number already here is left as it is and
// returned.
func (r Repo) FetchFromTier(ctx context.Context, tr *tier.Repo, meta []byte, container string, seq int) (*Record, tier.FetchStats, error) {
	if err := checkRef(container, seq); err != nil {
		return nil, tier.FetchStats{}, fmt.Errorf("fetch from %s: %w", tr, err)
	}
	if have, err := r.Load(container, seq); err == nil {
		return have, tier.FetchStats{}, nil
	}
	name := fmt.Sprintf("%s:%d", container, seq)
	corrupt := func(what, reason string, err error) error {
		return &CorruptError{Image: name, What: what, Reason: reason, Err: err}
	}
	var rec Record
	// The record names its manifest: the manifest is read (and verified
	// by its name) to check the record against it, as an export stream's.
	var probe struct {
		Manifest store.ID `json:"manifest"`
	}
	if err := json.Unmarshal(meta, &probe); err != nil {
		return nil, tier.FetchStats{}, corrupt("record", err.Error(), err)
	}
	man, err := tr.LoadManifest(ctx, probe.Manifest)
	if errors.Is(err, tier.ErrCorrupt) {
		return nil, tier.FetchStats{}, corrupt("manifest "+probe.Manifest.Short(), err.Error(), err)
	}
	if err != nil {
		return nil, tier.FetchStats{}, err
	}
	if err := checkImported(meta, []store.ID{probe.Manifest}, []*store.Manifest{man}, &imageRef{container, seq}, &rec); err != nil {
		return nil, tier.FetchStats{}, corrupt("record", err.Error(), err)
	}
	if r.CheckConfig != nil {
		if err := r.CheckConfig(rec.Config); err != nil {
			return nil, tier.FetchStats{}, corrupt("record", "config: "+err.Error(), err)
		}
	}
	st, err := r.OpenWriter(ctx)
	if err != nil {
		return nil, tier.FetchStats{}, err
	}
	defer st.Close()
	stats, err := tr.Fetch(ctx, st, rec.Manifest)
	if errors.Is(err, tier.ErrCorrupt) || errors.Is(err, store.ErrCorrupt) {
		return nil, stats, corrupt("chunk", err.Error(), err)
	}
	if err != nil {
		return nil, stats, err
	}
	rec.Pinned = false
	if err := r.saveRecord(&rec); err != nil {
		return nil, stats, err
	}
	return &rec, stats, nil
}
