package coord

import (
	"context"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/events"
)

// metricsFeed feeds the coordinator's events and records to its metrics.
type metricsFeed struct{ c *Coordinator }

// feedMetrics hands Options.Metrics every event of the coordinator's
// stream after past, with the catalog's record of each durable checkpoint
// and ended migration, until ctx is done. It first replays past, the
// history from before the coordinator started (an earlier coordinator's
// events), which sets the gauges of every job's newest checkpoints and
// counts nothing.
func (mf *metricsFeed) feedMetrics(ctx context.Context, past []evv1.Event) {
	c := mf.c
	m := c.opts.Metrics
	var last uint64
	newest := map[string]int{} // by job, its newest durable checkpoint in the history
	for _, e := range past {
		m.Event(e, false)
		last = e.Seq
		if e.Type == evv1.CkptDurable && e.Ckpt > newest[e.Job] {
			newest[e.Job] = e.Ckpt
		}
	}
	for job, seq := range newest {
		var ck coordv1.Ckpt
		if _, err := c.cat.Get(ctx, ckptKey(job, seq), &ck); err == nil {
			m.Checkpoint(ck, false)
		}
	}
	for ctx.Err() == nil {
		sub := c.opts.Events.Subscribe(events.Filter{AfterSeq: last}, followBuffer)
		for {
			e, ok := sub.Wait(ctx)
			if !ok {
				break
			}
			mf.observe(ctx, e)
			last = e.Seq
		}
		lagged := sub.Lagged()
		sub.Cancel()
		if !lagged {
			return // ctx is done, or the stream closed
		}
		// Fell behind: take up again from the history.
	}
}

// observe hands the metrics one live event, and the record it stands for.
func (mf *metricsFeed) observe(ctx context.Context, e evv1.Event) {
	c := mf.c
	m := c.opts.Metrics
	m.Event(e, true)
	switch e.Type {
	case evv1.CkptDurable:
		var ck coordv1.Ckpt
		if _, err := c.cat.Get(ctx, ckptKey(e.Job, e.Ckpt), &ck); err == nil {
			m.Checkpoint(ck, true)
		}
	case evv1.MigrationDone, evv1.MigrationFailed:
		var mig coordv1.Migration
		if _, err := c.cat.Get(ctx, migKey(e.Job, e.Ckpt), &mig); err == nil {
			m.Migration(mig)
		}
	}
}
