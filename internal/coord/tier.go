// The durable tier: a job's checkpoints flushed to an object store (or a
// shared file system) and a job restarted from there on a cluster that
// may not know it (docs/hpc.md). The agents do every read and write of
// the tier, with their own credentials: the coordinator links nothing of
// the node stack. A flush has each rank's image flushed by a node that
// holds it, then one agent write the checkpoint's record (the job, the
// checkpoint, each image's record) last: a record in the tier names only
// images already there.

package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
)

// maxTierRanks bounds the ranks of a job restarted from a tier's record.
const maxTierRanks = 1 << 14

// checkTierURL checks a tier URL as far as the coordinator can (an agent
// opens it): s3://BUCKET[/PREFIX] or file:///DIR, without credentials.
func checkTierURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return apiErr(agentv1.CodeBadRequest, "tier URL %q: %v", raw, err)
	case u.User != nil:
		return apiErr(agentv1.CodeBadRequest, "tier URL %s://%s%s: credentials belong in the agents' environment or credentials file, not in the URL", u.Scheme, u.Host, u.Path)
	case u.RawQuery != "" || u.Fragment != "":
		return apiErr(agentv1.CodeBadRequest, "tier URL %q: no query or fragment is taken", raw)
	case u.Scheme == "s3" && u.Host != "", u.Scheme == "file" && u.Host == "" && strings.HasPrefix(u.Path, "/"):
		return nil
	}
	return apiErr(agentv1.CodeBadRequest, "tier URL %q: want s3://BUCKET[/PREFIX] or file:///DIR", raw)
}

// Flush flushes a job's checkpoint to its durable tier (or req.Tier).
func (c *Coordinator) Flush(ctx context.Context, job string, req coordv1.Flush) (*coordv1.Ckpt, error) {
	defer c.locks.lock(job)()
	return c.tiers.flush(ctx, job, req)
}

// tiers reach the durable tier through the agents.
type tiers struct{ c *Coordinator }

// flush is Flush with the job's lock held: the images of the checkpoint,
// each from a live node that holds it, then its record.
func (ts *tiers) flush(ctx context.Context, job string, req coordv1.Flush) (*coordv1.Ckpt, error) {
	c := ts.c
	j, err := c.rec.job(ctx, job)
	if err != nil {
		return nil, err
	}
	base := req.Tier
	if base == "" {
		base = j.Tier
	}
	if base == "" {
		return nil, apiErr(agentv1.CodeBadRequest, "job %s has no durable tier: give one (cairn flush --tier URL), or run the job with --tier URL", job)
	}
	if err := checkTierURL(base); err != nil {
		return nil, err
	}
	cks, err := c.rec.ckpts(ctx, job)
	if err != nil {
		return nil, err
	}
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	ck, err := restorable(cks, req.Seq, live, "")
	if err != nil {
		return nil, err
	}
	// Each rank's image from the node it was taken on if it is alive,
	// else from a live replica.
	byNode := map[string][]agentv1.ImageRef{}
	for _, r := range ck.Ranks {
		copies := liveCopies(r, live)
		from := copies[0]
		if slices.Contains(copies, r.Node) {
			from = r.Node
		}
		byNode[from] = append(byNode[from], agentv1.ImageRef{Container: agentv1.RankName(job, r.Rank), Seq: ck.Seq})
	}
	repo := coordv1.TierRepo(base, job)
	start := time.Now()
	images := make([]agentv1.TierImage, len(ck.Ranks))
	var mu sync.Mutex
	err = c.agents.onNodes(ctx, slices.Sorted(maps.Keys(byNode)), func(node string, cl Agent) error {
		out, err := cl.TierFlush(ctx, agentv1.TierFlush{URL: repo, Images: byNode[node]})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, im := range out.Images {
			if _, r, ok := agentv1.ParseRankName(im.Container); ok && r >= 0 && r < len(images) && im.Seq == ck.Seq {
				images[r] = im
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("flush %s:%d to %s: %w", job, ck.Seq, repo, err)
	}
	fl := &coordv1.Flushed{URL: base, At: time.Now().UTC()}
	for r, im := range images {
		if im.Container == "" {
			return nil, fmt.Errorf("flush %s:%d to %s: no node answered for rank %d", job, ck.Seq, repo, r)
		}
		fl.Chunks += im.Chunks
		fl.NewChunks += im.NewChunks
		fl.Bytes += im.Bytes
		fl.Manifests = append(fl.Manifests, im.Manifest)
	}
	rec := coordv1.TierCkpt{Version: coordv1.TierCkptVersion, Job: *j, Ckpt: *ck, Images: images}
	rec.Ckpt.Unavailable, rec.Ckpt.Flushed = nil, nil
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	// The record last, through a node that flushed.
	writer := slices.Sorted(maps.Keys(byNode))[0]
	cl, err := c.agents.client(ctx, writer)
	if err == nil {
		err = cl.TierRecord(ctx, agentv1.TierRecord{URL: repo, Seq: ck.Seq, Data: data})
	}
	if err != nil {
		return nil, fmt.Errorf("flush %s:%d to %s: write its record: %w", job, ck.Seq, repo, err)
	}
	fl.Duration = time.Since(start)
	var out coordv1.Ckpt
	err = c.cat.Update(ctx, ckptKey(job, ck.Seq), &out, func() error {
		out.Flushed = fl
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.log.Info("checkpoint flushed", "job", job, "ckpt", ck.Seq, "tier", repo, "new_chunks", fl.NewChunks, "bytes", fl.Bytes, "took", fl.Duration)
	c.publish(evv1.Event{Type: evv1.CkptFlushed, Job: job, Ckpt: ck.Seq, Duration: fl.Duration, Bytes: fl.Bytes,
		Message: fmt.Sprintf("to %s: %d of %d chunks new", repo, fl.NewChunks, fl.Chunks)})
	return &out, nil
}

// prune has the job's tier keep only what the catalog lists: the records
// of its flushed checkpoints and their images. The caller holds the job's
// lock.
func (ts *tiers) prune(ctx context.Context, j *coordv1.Job) error {
	c := ts.c
	cks, err := c.rec.ckpts(ctx, j.Name)
	if err != nil {
		return err
	}
	req := agentv1.TierPrune{URL: coordv1.TierRepo(j.Tier, j.Name), Records: []int{}, Manifests: []string{}}
	for _, ck := range cks {
		if ck.Flushed != nil && ck.Flushed.URL == j.Tier {
			req.Records = append(req.Records, ck.Seq)
			req.Manifests = append(req.Manifests, ck.Flushed.Manifests...)
		}
	}
	return ts.onAnyNode(ctx, func(cl Agent) error {
		out, err := cl.TierPrune(ctx, req)
		if err == nil {
			c.log.Info("tier pruned", "job", j.Name, "tier", req.URL, "records", out.Records, "manifests", out.Manifests, "packs", out.Packs, "bytes", out.Bytes)
		}
		return err
	})
}

// onAnyNode calls fn with the agent of one live node after another until
// one answers: an error that is an agent's answer is returned as it is.
func (ts *tiers) onAnyNode(ctx context.Context, fn func(cl Agent) error) error {
	c := ts.c
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return err
	}
	if len(live) == 0 {
		return apiErr(coordv1.CodeNoNodes, "no live node to reach the durable tier through")
	}
	var errs []error
	for _, n := range slices.Sorted(maps.Keys(live)) {
		cl, err := c.agents.client(ctx, n)
		if err == nil {
			err = fn(cl)
		}
		var we *agentv1.Error
		if err == nil || errors.As(err, &we) {
			return err
		}
		errs = append(errs, fmt.Errorf("%s: %w", n, err))
	}
	return errors.Join(errs...)
}

// restartFromTier restarts job from the durable tier at req.Tier: the
// record of its checkpoint req.From (or the newest) is read and checked,
// the job and the checkpoint enter the catalog (the job keeps its
// addresses and gets a job network of this cluster), each rank's image is
// fetched to the node it restarts on, and the job restarts from it as
// from any checkpoint. A job this cluster already has is refused.
func (jr *jobRuns) restartFromTier(ctx context.Context, name string, req coordv1.Restart) (*coordv1.Job, error) {
	c := jr.c
	if err := checkTierURL(req.Tier); err != nil {
		return nil, err
	}
	repo := coordv1.TierRepo(req.Tier, name)
	var rec *coordv1.TierCkpt
	err := c.tiers.onAnyNode(ctx, func(cl Agent) error {
		var err error
		rec, err = readTierCkpt(ctx, cl, repo, name, req.From)
		return err
	})
	if err != nil {
		return nil, err
	}
	placement, err := jr.importFromTier(ctx, rec, req, repo)
	if err != nil {
		return nil, err
	}
	c.log.Info("job imported from the durable tier", "job", name, "ckpt", rec.Ckpt.Seq, "tier", repo, "placement", placement)
	j, err := jr.restart(ctx, name, coordv1.Restart{From: rec.Ckpt.Seq, Placement: placement, Lazy: req.Lazy}, restartAsked)
	if err != nil {
		// What it entered goes again, so that the restart can be asked
		// again (the tier is left as it is).
		if _, rerr := c.RemoveJob(context.WithoutCancel(ctx), name, true); rerr != nil {
			c.log.Warn("remove a job whose restart from the durable tier failed", "job", name, "err", rerr)
		}
		return nil, err
	}
	return j, nil
}

// readTierCkpt reads through cl the tier's record of checkpoint seq of
// job name (the newest if seq is 0) in repo, and checks it.
func readTierCkpt(ctx context.Context, cl Agent, repo, name string, seq int) (*coordv1.TierCkpt, error) {
	raw, err := cl.TierRead(ctx, agentv1.TierRead{URL: repo, Seq: seq})
	if err != nil {
		return nil, fmt.Errorf("read the record of %s in %s: %w", name, repo, err)
	}
	var rec coordv1.TierCkpt
	if err := json.Unmarshal(raw.Data, &rec); err != nil {
		return nil, apiErr(agentv1.CodeCorrupt, "the record of checkpoint %s:%d in %s is damaged: %v", name, raw.Seq, repo, err)
	}
	if err := checkTierCkpt(&rec, name, raw.Seq); err != nil {
		return nil, apiErr(agentv1.CodeCorrupt, "the record of checkpoint %s:%d in %s is damaged: %v", name, raw.Seq, repo, err)
	}
	return &rec, nil
}

// checkTierCkpt checks a record read from the tier, hostile input, before
// anything of it is used: it must be of job name and checkpoint seq, and
// its ranks, addresses and images must agree.
func checkTierCkpt(rec *coordv1.TierCkpt, name string, seq int) error {
	j, ck := &rec.Job, &rec.Ckpt
	n := len(j.Addrs)
	switch {
	case rec.Version < 1 || rec.Version > coordv1.TierCkptVersion:
		return fmt.Errorf("version %d, this cairn reads up to %d", rec.Version, coordv1.TierCkptVersion)
	case j.Name != name || ck.Job != name:
		return fmt.Errorf("it is of job %q (checkpoint of %q), not %s", j.Name, ck.Job, name)
	case ck.Seq != seq:
		return fmt.Errorf("it is of checkpoint %d, filed as %d", ck.Seq, seq)
	case n < 1 || n > maxTierRanks || j.Ranks != n || len(ck.Ranks) != n || len(rec.Images) != n:
		return fmt.Errorf("%d ranks, %d addresses, %d checkpoint ranks, %d images: they must agree (at most %d)", j.Ranks, n, len(ck.Ranks), len(rec.Images), maxTierRanks)
	case j.Replicas < 0 || j.Keep < 0 || j.FlushEvery < 0:
		return errors.New("negative replicas, keep or flush-every")
	}
	subnet, err := netip.ParsePrefix(j.Subnet)
	if err != nil || !subnet.Addr().Is4() {
		return fmt.Errorf("subnet %q: not an IPv4 prefix", j.Subnet)
	}
	seen := map[netip.Addr]bool{}
	for r, s := range j.Addrs {
		a, err := netip.ParseAddr(s)
		if err != nil || !subnet.Contains(a) || seen[a] || a == subnet.Masked().Addr() {
			return fmt.Errorf("rank %d's address %q: not a distinct host address of %s", r, s, subnet)
		}
		seen[a] = true
		if ck.Ranks[r].Rank != r {
			return fmt.Errorf("checkpoint rank %d is numbered %d", r, ck.Ranks[r].Rank)
		}
		if im := rec.Images[r]; im.Container != agentv1.RankName(name, r) || im.Seq != seq {
			return fmt.Errorf("rank %d's image is %s:%d, want %s:%d", r, im.Container, im.Seq, agentv1.RankName(name, r), seq)
		}
	}
	return nil
}

// importFromTier enters the job and the checkpoint of rec into the
// catalog, the checkpoint held by no node but in the tier at repo, and
// returns the nodes its ranks are to restart on: the restart fetches each
// rank's image there from the tier, or restores it lazily from the tier.
func (jr *jobRuns) importFromTier(ctx context.Context, rec *coordv1.TierCkpt, req coordv1.Restart, repo string) ([]string, error) {
	c := jr.c
	name := rec.Job.Name
	defer c.locks.lock(name)()
	if j, err := c.rec.job(ctx, name); err == nil {
		return nil, apiErr(agentv1.CodeExists, "job %s exists on this cluster (%s): restart it from its checkpoints here (cairn restart %s), or remove it first (cairn rm -f %s)", name, j.State, name, name)
	}
	jobs, err := c.Jobs(ctx)
	if err != nil {
		return nil, err
	}
	subnet := netip.MustParsePrefix(rec.Job.Subnet)
	for _, o := range jobs {
		if p, err := netip.ParsePrefix(o.Subnet); err == nil && p.Overlaps(subnet) {
			return nil, apiErr(coordv1.CodeConflict, "job %s's subnet %s overlaps job %s's (%s) here: its ranks keep their addresses, so remove or stop that job first", name, subnet, o.Name, o.Subnet)
		}
	}
	n := len(rec.Job.Addrs)
	placement := req.Placement
	if len(placement) > 0 {
		if len(placement) != n {
			return nil, apiErr(agentv1.CodeBadRequest, "placement names %d nodes, job %s has %d ranks", len(placement), name, n)
		}
		if _, err := c.rec.candidates(ctx, placement, true); err != nil {
			return nil, err
		}
	} else {
		cands, err := c.rec.candidates(ctx, req.Nodes, true)
		if err != nil {
			return nil, err
		}
		if placement, err = place(n, rec.Job.PerNode, cands, nil); err != nil {
			return nil, err
		}
	}
	vni, err := c.rec.allocVNI(ctx)
	if err != nil {
		return nil, err
	}
	j := rec.Job
	seq := rec.Ckpt.Seq
	j.VNI, j.Placement, j.Leftover, j.Interval = vni, placement, nil, nil
	j.State, j.Reason, j.StoppedAt = coordv1.JobStopped, fmt.Sprintf("imported from the durable tier: checkpoint %d of %s", seq, repo), seq
	j.RestartFrom, j.RestartPhase, j.LastCkpt, j.NextCkpt = 0, "", seq, max(j.NextCkpt, seq+1)
	j.Tier = req.Tier
	ck := rec.Ckpt
	ck.State, ck.Unavailable, ck.Pinned = coordv1.CkptDurable, nil, false
	ck.Flushed = &coordv1.Flushed{URL: j.Tier, At: time.Now().UTC()}
	for r := range ck.Ranks {
		ck.Ranks[r].Node, ck.Ranks[r].Copies = "", nil // taken on another cluster
		ck.Flushed.Manifests = append(ck.Flushed.Manifests, rec.Images[r].Manifest)
	}
	if err := c.cat.Create(ctx, jobKey(name), &j); err != nil {
		if errors.Is(err, catalog.ErrExists) {
			return nil, apiErr(agentv1.CodeExists, "job %s exists on this cluster", name)
		}
		return nil, err
	}
	if err := c.cat.Create(ctx, ckptKey(name, seq), &ck); err != nil {
		_ = c.cat.Delete(context.WithoutCancel(ctx), jobKey(name))
		return nil, err
	}
	return placement, nil
}
