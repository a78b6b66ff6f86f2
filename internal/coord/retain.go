// Retention of a job's global checkpoints across the cluster: a job run
// with Keep keeps its newest protected checkpoints, and users remove and
// pin checkpoints by hand. A checkpoint leaves the catalog first, then
// every live node drops its rank images (own copies and replicas): the
// catalog never lists a checkpoint whose images are being dropped, and a
// node that was not reached keeps images no checkpoint lists, which its
// gc reclaims.

package coord

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
)

// retention removes jobs' checkpoints: those a job's Keep no longer
// covers, and those users remove.
type retention struct{ c *Coordinator }

// retain removes the checkpoints of job beyond its Keep newest protected
// ones (retired).
func (rt *retention) retain(ctx context.Context, job string) error {
	c := rt.c
	defer c.locks.lock(job)()
	j, err := c.rec.job(ctx, job)
	if err != nil {
		return err
	}
	cks, err := c.rec.ckpts(ctx, job)
	if err != nil {
		return err
	}
	gone := retired(j, cks)
	if len(gone) == 0 {
		return nil
	}
	_, err = rt.removeCkpts(ctx, j, gone, fmt.Sprintf("retention: the job keeps its newest %d", j.Keep))
	return err
}

// retired returns the checkpoints of j that its Keep no longer covers:
// each one older than the oldest of its Keep newest protected ones,
// unless it is pinned, a round or restart may still need it (not yet
// ended), or it is the newest one flushed to the durable tier (which
// keeps what the catalog lists: the tier is never left empty). Nothing
// while the job has fewer than Keep protected ones.
func retired(j *coordv1.Job, cks []coordv1.Ckpt) []coordv1.Ckpt {
	if j.Keep <= 0 {
		return nil
	}
	var protected []int
	for _, ck := range cks {
		if ck.State == coordv1.CkptProtected {
			protected = append(protected, ck.Seq)
		}
	}
	if len(protected) < j.Keep {
		return nil
	}
	slices.Sort(protected)
	oldest := protected[len(protected)-j.Keep]
	flushed := 0
	for _, ck := range cks {
		if ck.Flushed != nil {
			flushed = ck.Seq
		}
	}
	var out []coordv1.Ckpt
	for _, ck := range cks {
		if ck.Seq >= oldest || ck.Pinned || !ended(ck) || ck.Seq == j.RestartFrom || ck.Seq == j.StoppedAt || ck.Seq == flushed {
			continue
		}
		out = append(out, ck)
	}
	return out
}

// ended says whether a checkpoint's round has ended: it is durable (or
// protected), or aborted with its aborts sent.
func ended(ck coordv1.Ckpt) bool {
	switch ck.State {
	case coordv1.CkptDurable, coordv1.CkptProtected:
		return true
	case coordv1.CkptAborted:
		return !ck.Finished.IsZero()
	}
	return false
}

// RemoveCkpt removes checkpoint seq of a job from the catalog, then its
// rank images from every live node. A pinned checkpoint is refused, as is
// one whose round has not ended or that a restart or stop refers to.
func (c *Coordinator) RemoveCkpt(ctx context.Context, job string, seq int) (*coordv1.CkptRemoved, error) {
	defer c.locks.lock(job)()
	j, err := c.rec.job(ctx, job)
	if err != nil {
		return nil, err
	}
	ck, err := c.rec.ckpt(ctx, job, seq)
	if err != nil {
		return nil, err
	}
	switch {
	case ck.Pinned:
		return nil, apiErr(coordv1.CodeConflict, "checkpoint %s:%d is pinned: unpin it first (cairn checkpoint unpin %s:%d)", job, seq, job, seq)
	case !ended(*ck):
		return nil, apiErr(coordv1.CodeConflict, "checkpoint %s:%d is %s: its round has not ended", job, seq, ck.State)
	case seq == j.RestartFrom && j.State == coordv1.JobRestarting:
		return nil, apiErr(coordv1.CodeConflict, "job %s is restarting from checkpoint %d", job, seq)
	case seq == j.StoppedAt && j.State == coordv1.JobStopped:
		return nil, apiErr(coordv1.CodeConflict, "job %s is stopped at checkpoint %d, which cairn restart resumes it from: remove the job (cairn rm -f) to drop it", job, seq)
	}
	return c.keep.removeCkpts(ctx, j, []coordv1.Ckpt{*ck}, "removed by a user")
}

// removeCkpts deletes cks of job j from the catalog, then has every live
// node drop their rank images, for why. The caller holds the job's lock.
func (rt *retention) removeCkpts(ctx context.Context, j *coordv1.Job, cks []coordv1.Ckpt, why string) (*coordv1.CkptRemoved, error) {
	c := rt.c
	out := &coordv1.CkptRemoved{Job: j.Name}
	var seqs []int
	for _, ck := range cks {
		if err := c.cat.Delete(ctx, ckptKey(j.Name, ck.Seq)); err != nil {
			return out, err
		}
		seqs = append(seqs, ck.Seq)
		out.Seq = ck.Seq
		c.publish(evv1.Event{Type: evv1.CkptRemoved, Job: j.Name, Ckpt: ck.Seq, Message: why})
	}
	ranks := make([]string, len(j.Placement))
	for r := range j.Placement {
		ranks[r] = agentv1.RankName(j.Name, r)
	}
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return out, err
	}
	var mu sync.Mutex
	err = c.agents.onNodes(ctx, slices.Sorted(maps.Keys(live)), func(_ string, cl Agent) error {
		d, err := cl.DropImages(ctx, agentv1.DropImages{Containers: ranks, Seqs: seqs})
		mu.Lock()
		out.Images += d.Images
		mu.Unlock()
		return err
	})
	if err != nil {
		c.log.Warn("drop the images of removed checkpoints", "job", j.Name, "ckpts", seqs, "err", err)
	}
	if j.Tier != "" && slices.ContainsFunc(cks, func(ck coordv1.Ckpt) bool { return ck.Flushed != nil }) {
		if err := c.tiers.prune(ctx, j); err != nil {
			return out, fmt.Errorf("checkpoints %v removed here, but not yet from the durable tier: %w", seqs, err)
		}
	}
	c.log.Info("checkpoints removed", "job", j.Name, "ckpts", seqs, "images", out.Images, "why", why)
	return out, nil
}

// PinCkpt pins checkpoint seq of a job (retention never removes it), or
// unpins it.
func (c *Coordinator) PinCkpt(ctx context.Context, job string, seq int, pin coordv1.Pin) (*coordv1.Ckpt, error) {
	var ck coordv1.Ckpt
	err := c.cat.Update(ctx, ckptKey(job, seq), &ck, func() error {
		ck.Pinned = pin.Pinned
		return nil
	})
	if errors.Is(err, catalog.ErrNotFound) {
		return nil, apiErr(agentv1.CodeNotFound, "no checkpoint %s:%d", job, seq)
	}
	if err != nil {
		return nil, err
	}
	return &ck, nil
}
