package coord

import (
	"context"
	"errors"
	"time"

	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/model"
)

// failuresKey holds the node failures the cluster has seen and the
// node-time it watched them over (model.Failures), from which a node's
// MTBF is estimated (docs/planning.md, "The checkpoint interval").
const failuresKey = "counters/failures"

// tallyEvery is how often the node-time watched is added up. A tally
// longer than twice this (no coordinator ran meanwhile) counts only this
// much: time nobody watched is not exposure.
const tallyEvery = time.Minute

// failureTally counts node failures and the node-time watched.
type failureTally struct{ c *Coordinator }

// watchFailures counts node failures (every node seen lost) and the
// node-time the coordinator watched, until ctx is done.
func (ft *failureTally) watchFailures(ctx context.Context) {
	c := ft.c
	last := time.Now()
	tally := func(lost int) {
		now := time.Now()
		d := min(now.Sub(last), 2*tallyEvery)
		last = now
		alive, err := c.cat.Alive(ctx)
		if err != nil {
			return
		}
		var f model.Failures
		err = c.cat.Update(ctx, failuresKey, &f, func() error {
			if f.Since.IsZero() {
				f.Since = now.Add(-d).UTC()
			}
			f.Exposure += d * time.Duration(len(alive)+lost)
			f.Count += lost
			return nil
		})
		if errors.Is(err, catalog.ErrNotFound) {
			f = model.Failures{Since: now.Add(-d).UTC(), Exposure: d * time.Duration(len(alive)+lost), Count: lost}
			err = c.cat.Create(ctx, failuresKey, &f)
		}
		if err != nil && ctx.Err() == nil {
			c.log.Warn("count node failures", "err", err)
		}
	}
	lost := c.cat.WatchAlive(ctx)
	t := time.NewTicker(tallyEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			tally(0)
		case ev, ok := <-lost:
			if !ok {
				return
			}
			if ev.Change == catalog.MemberLost {
				tally(1)
			}
		}
	}
}
