package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/store"
)

// GCResult says what Repo.GC removed.
type GCResult struct {
	Removed []string      `json:"removed"` // checkpoints whose records were deleted
	Kept    []string      `json:"kept"`
	Store   store.GCStats `json:"store"`
	DryRun  bool          `json:"dry_run"`
	Before  store.Stats   `json:"before"`
	After   store.Stats   `json:"after"`
}

// GCOptions says what GC keeps.
type GCOptions struct {
	// Keep is how many of every container's newest checkpoints are kept
	// (at least 1); pinned ones are kept besides.
	Keep int
	// Retain, if set, names more checkpoints to keep whatever Keep says:
	// those another retention governs (a job's rank images, which its
	// coordinator removes).
	Retain func(*Record) bool
	// DryRun only reports what would be removed.
	DryRun   bool
	Progress Progress
}

// GC applies the retention policy, keeping the newest opts.Keep
// checkpoints of every container plus every pinned (or retained) one,
// deletes the other records, and then reclaims every chunk and manifest
// that no remaining checkpoint uses (including what interrupted
// checkpoints left behind).
func (r Repo) GC(ctx context.Context, opts GCOptions) (GCResult, error) {
	var res GCResult
	keep, dryRun, progress := opts.Keep, opts.DryRun, opts.Progress
	res.DryRun = dryRun
	if keep < 1 {
		return res, fmt.Errorf("keep %d: at least the newest checkpoint of each container is kept", keep)
	}
	// The store first, then the catalog: a checkpoint being written holds
	// the store until its record is written, so the catalog read then
	// lists every image whose chunks are in the store.
	st, err := r.OpenWriter(ctx)
	if err != nil {
		return res, err
	}
	defer st.Close()
	recs, errs := r.All()
	if len(errs) > 0 {
		// A record that does not parse may name data still needed: refuse
		// rather than reclaim it.
		return res, fmt.Errorf("gc refused, the catalog has unreadable records: %w", errors.Join(errs...))
	}
	byContainer := map[string][]*Record{}
	for _, rec := range recs {
		byContainer[rec.Container] = append(byContainer[rec.Container], rec)
	}
	var keepIDs []store.ID
	for _, list := range byContainer {
		sort.Slice(list, func(i, j int) bool { return list[i].Seq < list[j].Seq })
		for i, rec := range list {
			if i >= len(list)-keep || rec.Pinned || opts.Retain != nil && opts.Retain(rec) {
				res.Kept = append(res.Kept, rec.Name())
				keepIDs = append(keepIDs, rec.Manifest)
				continue
			}
			res.Removed = append(res.Removed, rec.Name())
			if !dryRun {
				if err := r.Remove(rec.Container, rec.Seq); err != nil {
					return res, err
				}
			}
		}
	}
	sort.Strings(res.Kept)
	sort.Strings(res.Removed)
	if dryRun {
		return res, nil
	}
	res.Before = st.Stats()
	res.Store, err = st.GC(ctx, keepIDs, store.GCOptions{Progress: progress})
	if err != nil {
		return res, fmt.Errorf("gc: %w", err)
	}
	res.After = st.Stats()
	return res, nil
}

// Usage is one checkpoint's line of `cairn du`.
type Usage struct {
	Checkpoint string `json:"checkpoint"`
	Logical    int64  `json:"logical_bytes"` // the image's size as files
	Unique     int64  `json:"unique_bytes"`  // raw bytes of chunks no earlier listed checkpoint uses
	Stored     int64  `json:"stored_bytes"`  // stored (compressed) bytes of those chunks
}

// DiskUsage is what `cairn du` shows.
type DiskUsage struct {
	Checkpoints []Usage     `json:"checkpoints"`
	Store       store.Stats `json:"store"`
	Logical     int64       `json:"logical_bytes"` // sum over checkpoints
	// DedupRatio is logical bytes over the raw bytes actually kept;
	// CompressionRatio is raw over stored bytes.
	DedupRatio       float64 `json:"dedup_ratio"`
	CompressionRatio float64 `json:"compression_ratio"`
}

// DiskUsage accounts for every checkpoint, in catalog order: each is
// charged for the chunks no checkpoint before it uses.
func (r Repo) DiskUsage(ctx context.Context) (DiskUsage, error) {
	var du DiskUsage
	recs, errs := r.All()
	if len(recs) == 0 {
		return du, errors.Join(errs...)
	}
	st, err := r.OpenReader()
	if err != nil {
		return du, err
	}
	defer st.Close()
	seen := map[store.ID]bool{}
	for _, rec := range recs {
		u := Usage{Checkpoint: rec.Name(), Logical: rec.Logical}
		m, err := r.loadManifest(ctx, st, rec)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, id := range m.ChunkIDs() {
			if seen[id] {
				continue
			}
			seen[id] = true
			if stored, raw, ok := st.ChunkSize(id); ok {
				u.Unique += raw
				u.Stored += stored
			}
		}
		du.Checkpoints = append(du.Checkpoints, u)
		du.Logical += u.Logical
	}
	du.Store = st.Stats()
	if du.Store.RawBytes > 0 {
		du.DedupRatio = float64(du.Logical) / float64(du.Store.RawBytes)
	}
	if du.Store.StoredBytes > 0 {
		du.CompressionRatio = float64(du.Store.RawBytes) / float64(du.Store.StoredBytes)
	}
	return du, errors.Join(errs...)
}

// Export writes one checkpoint as a single self-contained file: its record
// and every chunk of its image.
func (r Repo) Export(ctx context.Context, container string, seq int, w io.Writer, progress Progress) (*Record, error) {
	return r.export(ctx, container, seq, w, nil, progress)
}

// ExportDelta writes one checkpoint as a delta export stream for a peer:
// its record and the chunks of its image for which have returns false.
// have is the peer's answer to Missing for ChunkIDs, turned around; it is
// called for every reference to a chunk, before anything is written. Only the
// peer's Receive reads such a stream, and it fails (matching ErrCorrupt
// and store.ErrNotFound, listing nothing) if the peer lacks a chunk that
// have claimed, e.g. because a gc ran there in between; the sender should
// then ask again what is missing, or send the full export.
//
// ("Delta" here is the difference between two stores, not the fs delta
// of an image.)
func (r Repo) ExportDelta(ctx context.Context, container string, seq int, w io.Writer, have func(store.ID) bool, progress Progress) (*Record, error) {
	if have == nil {
		return nil, errors.New("export delta: no chunk set to compare against")
	}
	return r.export(ctx, container, seq, w, have, progress)
}

func (r Repo) export(ctx context.Context, container string, seq int, w io.Writer, skip func(store.ID) bool, progress Progress) (*Record, error) {
	rec, err := r.Load(container, seq)
	if err != nil {
		return nil, err
	}
	meta, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	st, err := r.OpenReader()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	if err := st.Export(ctx, w, []store.ID{rec.Manifest}, meta, store.ExportOptions{Progress: progress, Skip: skip}); err != nil {
		return nil, r.corrupt(ctx, rec, err)
	}
	return rec, nil
}

// Import reads an export file, verifying every chunk and the manifest
// before the checkpoint becomes visible, and lists it as the next
// checkpoint of its container (or of as, if given). The file is hostile
// input: a record whose container name or checkpoint number is invalid
// (names.Container, names.Seq), or an image restore would refuse
// (devices, symlinks among CRIU's files, nodes outside criu/ and fs/, no
// CRIU files), is refused with ErrCorrupt before any of it is
// stored, and nothing is written outside the repo. A damaged file changes
// nothing that is listed.
func (r Repo) Import(ctx context.Context, rd io.Reader, as string, progress Progress) (*Record, error) {
	if as != "" {
		if err := names.Container(as); err != nil {
			return nil, fmt.Errorf("import: %w", err)
		}
	}
	return r.importStream(ctx, rd, as, nil, progress)
}

// Receive stores checkpoint container:seq, exported by another node
// (Export or ExportDelta), under that name and number: how a rank's image
// follows it to another node. The stream is hostile input, checked as
// Import checks a file; besides, its record must name container:seq, or
// Receive fails with ErrCorrupt before anything is stored. Everything in
// the stream is verified, and every chunk a delta stream leaves out must
// be in this repo's store already; otherwise Receive fails with
// ErrCorrupt (and, for a missing chunk, store.ErrNotFound) and lists
// nothing. A checkpoint of that name and number already here is left as
// it is and returned.
func (r Repo) Receive(ctx context.Context, rd io.Reader, container string, seq int, progress Progress) (*Record, error) {
	if err := names.Container(container); err != nil {
		return nil, fmt.Errorf("receive: %w", err)
	}
	if err := names.Seq(seq); err != nil {
		return nil, fmt.Errorf("receive: %w", err)
	}
	return r.importStream(ctx, rd, "", &imageRef{container, seq}, progress)
}

// imageRef names the checkpoint a stream must hold.
type imageRef struct {
	container string
	seq       int
}

// importStream imports an export stream. Only Receive (want set) takes
// delta streams: a file given to Import must stand alone. The stream's
// record and manifest are checked (checkImported) as soon as they are
// read, before any chunk is.
func (r Repo) importStream(ctx context.Context, rd io.Reader, as string, want *imageRef, progress Progress) (*Record, error) {
	st, err := r.OpenWriter(ctx)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var rec Record
	check := func(meta []byte, ids []store.ID, ms []*store.Manifest) error {
		if err := checkImported(meta, ids, ms, want, &rec); err != nil {
			return err
		}
		if r.CheckConfig != nil {
			if err := r.CheckConfig(rec.Config); err != nil {
				return fmt.Errorf("record: %v", err)
			}
		}
		return nil
	}
	ids, _, err := st.Import(ctx, rd, store.ImportOptions{Progress: progress, AllowDelta: want != nil, Check: check})
	if errors.Is(err, store.ErrCorrupt) {
		return nil, &CorruptError{Image: "import", What: "export file", Reason: err.Error(), Err: err}
	}
	if err != nil {
		return nil, err
	}
	if len(ids) != 1 || rec.Manifest != ids[0] {
		return nil, &CorruptError{Image: "import", What: "record", Reason: "export file does not describe one checkpoint"}
	}
	if as != "" {
		rec.Container = as
	}
	if want != nil {
		if have, err := r.Load(rec.Container, rec.Seq); err == nil {
			return have, nil
		}
	} else {
		rec.Seq = r.NextSeq(rec.Container)
	}
	rec.Pinned = false
	if err := r.saveRecord(&rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// checkImported decodes the record of an export stream into rec and
// checks it and the image's manifest, before any chunk is read: the
// record must describe the one manifest, name a valid container and
// checkpoint number (want's, if set), and the manifest must have the
// shape restore requires (checkShape).
func checkImported(meta []byte, ids []store.ID, ms []*store.Manifest, want *imageRef, rec *Record) error {
	if len(ms) != 1 {
		return fmt.Errorf("export file holds %d images, want one", len(ms))
	}
	if err := json.Unmarshal(meta, rec); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	if rec.Manifest != ids[0] {
		return fmt.Errorf("record names manifest %s, the file holds %s", rec.Manifest.Short(), ids[0].Short())
	}
	// The name errors are kept as text: a bad name inside a file is
	// damage (ErrCorrupt), not a caller's mistake (names.ErrInvalid).
	if err := names.Container(rec.Container); err != nil {
		return fmt.Errorf("record: %v", err)
	}
	if err := names.Seq(rec.Seq); err != nil {
		return fmt.Errorf("record: %v", err)
	}
	if want != nil && (rec.Container != want.container || rec.Seq != want.seq) {
		return fmt.Errorf("record names checkpoint %s, want %s:%d", rec.Name(), want.container, want.seq)
	}
	if err := checkShape(ms[0], rec.FilesOnly); err != nil {
		return fmt.Errorf("image %s: %w", rec.Name(), err)
	}
	return nil
}

// ChunkIDs returns the distinct chunks of a checkpoint's image, in order
// of first use: what a peer needs, besides the record and the manifest
// (which travel in every export stream), to hold the checkpoint. Ask the
// peer's Missing which of them to send.
func (r Repo) ChunkIDs(ctx context.Context, container string, seq int) ([]store.ID, error) {
	_, st, m, err := r.openManifest(ctx, container, seq)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	return m.ChunkIDs(), nil
}

// Missing returns, in the order given, the ids this repo's store lacks:
// the chunks a peer must send for a delta export. A repo with no store
// yet lacks them all. The answer is a snapshot: a gc here may reclaim
// unused chunks before the delta stream arrives, which Receive then
// detects.
func (r Repo) Missing(ctx context.Context, ids []store.ID) ([]store.ID, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st, err := r.OpenReader()
	if errors.Is(err, ErrNotFound) {
		return slices.Clone(ids), nil
	}
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var out []store.ID
	for _, id := range ids {
		if !st.Has(id) {
			out = append(out, id)
		}
	}
	return out, nil
}

// StoreReport is what CheckStore found, with manifests named by the
// checkpoints that use them.
type StoreReport struct {
	Packs, Chunks, Manifests int
	Problems                 []string // one line each; empty when healthy
}

// CheckStore checks the whole store under the catalog: every pack, index
// entry and manifest, and with readData every chunk's bytes. Problems name
// the checkpoints they affect.
func (r Repo) CheckStore(ctx context.Context, readData bool, progress Progress) (StoreReport, error) {
	var rep StoreReport
	st, err := r.OpenReader()
	if err != nil {
		return rep, err
	}
	defer st.Close()
	cr, err := st.Check(ctx, store.CheckOptions{ReadData: readData, Progress: progress})
	if err != nil {
		return rep, err
	}
	rep.Packs, rep.Chunks, rep.Manifests = cr.Packs, cr.Chunks, cr.Manifests
	users := map[store.ID][]string{}
	recs, _ := r.All()
	for _, rec := range recs {
		users[rec.Manifest] = append(users[rec.Manifest], rec.Name())
	}
	name := func(ids []store.ID) []string {
		var out []string
		for _, id := range ids {
			if u, ok := users[id]; ok {
				out = append(out, u...)
			} else {
				out = append(out, "unlisted manifest "+id.Short())
			}
		}
		return out
	}
	for _, q := range cr.Quarantined {
		rep.Problems = append(rep.Problems, q.String())
	}
	for _, p := range cr.BadPacks {
		rep.Problems = append(rep.Problems, fmt.Sprintf("pack %s: missing=%v %v", p.ID.Short(), p.Missing, p.Err))
	}
	for _, c := range cr.BadChunks {
		rep.Problems = append(rep.Problems, fmt.Sprintf("chunk %s in pack %s: %v (affects %v)", c.ID.Short(), c.Pack.Short(), c.Err, name(c.AffectedManifests)))
	}
	for _, m := range cr.BadManifests {
		rep.Problems = append(rep.Problems, fmt.Sprintf("manifest %s: %v (affects %v)", m.ID.Short(), m.Err, name([]store.ID{m.ID})))
	}
	return rep, nil
}

// Damage is what SetAsideDamaged found wrong with a checkpoint's image.
type Damage struct {
	Chunks   int  // chunks that did not read back intact, now set aside
	Manifest bool // the manifest was damaged (or gone), now removed
}

// Any reports whether anything was damaged.
func (d Damage) Any() bool { return d.Chunks > 0 || d.Manifest }

// SetAsideDamaged reads every chunk of a checkpoint's image and sets aside
// what does not read back intact, so that receiving the image again from a
// peer (Receive, with a delta stream of what Missing reports) replaces
// exactly the damaged parts: damaged chunks are set aside in the store
// (store.Scrub), a damaged manifest is removed. Chunks other images share
// are repaired for them too. An intact image is left as it is and yields a
// zero Damage.
func (r Repo) SetAsideDamaged(ctx context.Context, container string, seq int) (Damage, error) {
	var d Damage
	rec, err := r.Load(container, seq)
	if err != nil {
		return d, err
	}
	st, err := r.OpenWriter(ctx)
	if err != nil {
		return d, err
	}
	defer st.Close()
	m, err := st.LoadManifest(ctx, rec.Manifest)
	if errors.Is(err, store.ErrCorrupt) || errors.Is(err, store.ErrNotFound) {
		if err := st.RemoveManifest(ctx, rec.Manifest); err != nil && !errors.Is(err, store.ErrNotFound) {
			return d, err
		}
		d.Manifest = true
		return d, nil
	}
	if err != nil {
		return d, err
	}
	bad, err := st.Scrub(ctx, m.ChunkIDs())
	d.Chunks = len(bad)
	return d, err
}

// QuarantineError reports damaged packs that the store's recovery moved to
// quarantine/ (store.Quarantine): what still verified was salvaged, the
// rest is lost, and the packs are kept for an operator to examine. It
// matches ErrCorrupt and store.ErrCorrupt.
type QuarantineError struct {
	Err *store.QuarantineError
}

func (e *QuarantineError) Error() string { return e.Err.Error() }

// Is matches ErrCorrupt.
func (e *QuarantineError) Is(target error) bool { return target == ErrCorrupt }

// Unwrap returns the store's report.
func (e *QuarantineError) Unwrap() error { return e.Err }

// Quarantined lists the damaged packs in the store's quarantine/.
func (r Repo) Quarantined() ([]store.Quarantine, error) { return store.Quarantined(r.StoreDir) }

// QuarantinedSince returns a *QuarantineError naming every pack in the
// store's quarantine/ that is not in before (an earlier Quarantined), or
// nil if there is none: how a command tells that the store it used found
// damage, whatever the command itself achieved.
func (r Repo) QuarantinedSince(before []store.Quarantine) error {
	now, err := r.Quarantined()
	if err != nil {
		return err
	}
	seen := make(map[string]bool, len(before))
	for _, q := range before {
		seen[q.File] = true
	}
	var fresh []store.Quarantine
	for _, q := range now {
		if !seen[q.File] {
			fresh = append(fresh, q)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	return &QuarantineError{Err: &store.QuarantineError{Dir: r.StoreDir, Packs: fresh}}
}
