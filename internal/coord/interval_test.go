package coord_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
	"github.com/cairn-hpc/cairn/internal/events"
	"github.com/cairn-hpc/cairn/internal/model"
)

// TestAutoInterval: a job with --checkpoint-every auto is checkpointed
// at Daly's interval for its MTBF, from the default cost before its first
// round, then from the cost its rounds measured; every change is recorded
// in the job and published with why, and the rounds follow it.
func TestAutoInterval(t *testing.T) {
	// Calls take up to 100 ms to reach their node: rounds stall ranks
	// for a measurable time.
	e := newMemEnv(t, 4, memagent.Options{Seed: 1, Delay: 100 * time.Millisecond}, coord.Options{})
	c1 := e.start()
	ctx := context.Background()
	run := coordv1.RunJob{Name: "ring", Ranks: 4, PerNode: 1, Args: []string{"/bin/ring"}, CheckpointAuto: true}
	var we *agentv1.Error
	if _, err := c1.RunJob(ctx, run); !errors.As(err, &we) || we.Code != agentv1.CodeBadRequest {
		t.Fatalf("an automatic interval with no MTBF known: %v, want bad_request", err)
	}
	run.MTBF = 40 * time.Second // a node's: the job's on 4 nodes is 10 s
	if _, err := c1.RunJob(ctx, run); err != nil {
		t.Fatal(err)
	}
	const jobMTBF = 10 * time.Second
	intervals := func() []evv1.Event {
		return c1.Events().History(events.Filter{Job: "ring", Type: evv1.JobInterval})
	}

	// Before any round: the default cost.
	waitFor(t, 5*time.Second, "the first interval", func() bool { return len(intervals()) >= 1 })
	first := intervals()[0]
	want := model.Choose(model.DefaultCost, jobMTBF)
	j, err := c1.Status(ctx, "ring")
	if err != nil {
		t.Fatal(err)
	}
	if iv := j.Interval; iv == nil || iv.Every != want.Every || iv.Cost != model.DefaultCost || iv.MTBF != jobMTBF || first.Duration != want.Every ||
		!strings.Contains(first.Message, "no round measured yet") || !strings.Contains(first.Message, "the job's --mtbf") {
		t.Fatalf("first interval %+v, event %q (%s); want every %s from the default cost", j.Interval, first.Message, first.Duration, want.Every)
	}

	// After the first round (periodic, at that interval): the cost it
	// measured, a shorter interval.
	waitFor(t, 2*want.Every+5*time.Second, "an interval from a measured cost", func() bool { return len(intervals()) >= 2 })
	second := intervals()[1]
	if j, err = c1.Status(ctx, "ring"); err != nil {
		t.Fatal(err)
	}
	iv := j.Interval
	cks, err := c1.Checkpoints(ctx, "ring")
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for _, ck := range cks {
		if !ck.Created.After(iv.At) && ck.Stall > 0 {
			lo, hi = min(lo, ck.Stall), max(hi, ck.Stall)
		}
	}
	if iv.Cost < lo || iv.Cost > hi || iv.Every != model.Choose(iv.Cost, jobMTBF).Every || iv.Every >= want.Every ||
		second.Duration != iv.Every || !strings.Contains(second.Message, "was every "+want.Every.Round(time.Millisecond).String()) ||
		!strings.Contains(second.Message, "durable round") {
		t.Fatalf("second interval %+v, event %q; want Daly's for a cost among the stalls measured (%s..%s)", iv, second.Message, lo, hi)
	}
	t.Logf("intervals: %s (default cost), then %s (cost %s)", want.Every, iv.Every, iv.Cost)

	// The next rounds come at the new interval (the periodic loop looks
	// every 250 ms).
	seen := len(cks)
	waitFor(t, 3*iv.Every+5*time.Second, "two more periodic rounds", func() bool {
		cks, err = c1.Checkpoints(ctx, "ring")
		return err == nil && len(cks) >= seen+2
	})
	a, b := cks[seen], cks[seen+1]
	cur := iv.Every
	if j, err = c1.Status(ctx, "ring"); err == nil && j.Interval.At.Before(b.Created) {
		cur = j.Interval.Every
	}
	if gap := b.Created.Sub(a.Created); gap < cur || gap > cur+time.Second {
		t.Errorf("rounds %d and %d %s apart, interval %s", a.Seq, b.Seq, gap, cur)
	}
	// Re-evaluated after every round, changed only by more than 10%.
	evs := intervals()
	for i := 1; i < len(evs); i++ {
		if !model.Changed(evs[i-1].Duration, evs[i].Duration) {
			t.Errorf("interval changed from %s to %s: within the hysteresis", evs[i-1].Duration, evs[i].Duration)
		}
	}

	// The report says so.
	r, err := c1.Report(ctx, "ring")
	if err != nil {
		t.Fatal(err)
	}
	if r.Interval == nil || r.Every != r.Interval.Every || r.MTBF.Source != "job" || r.MTBF.Job != jobMTBF || len(r.Ckpts) < seen+1 {
		t.Errorf("report: every %s, interval %+v, mtbf %+v, %d rounds", r.Every, r.Interval, r.MTBF, len(r.Ckpts))
	}
}

// TestNodeFailuresCounted: every node lost counts toward the cluster's
// estimate of a node's MTBF, with the node-time watched; the estimate is
// not used before model.MinFailures.
func TestNodeFailuresCounted(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{MTBF: time.Hour})
	c1 := e.start()
	c1.runJob(t, "solo", 1, 0, "n0")
	time.Sleep(200 * time.Millisecond)
	e.mc.Kill("n2")
	var r *coordv1.Report
	waitFor(t, 15*time.Second, "the failure counted", func() bool {
		var err error
		r, err = c1.Report(context.Background(), "solo")
		return err == nil && r.MTBF.Failures == 1
	})
	if r.MTBF.Exposure <= 0 || r.MTBF.Since.IsZero() || r.MTBF.Trusted || r.MTBF.Source != "coordinator" || r.MTBF.Node != time.Hour {
		t.Errorf("mtbf %+v: want one failure over some node-time, the coordinator's MTBF in use", r.MTBF)
	}
}

// TestPeriodicAfterBusy: periodic rounds that fall while the job is busy
// (here: migrations one after the other, which hold its lock) are
// skipped, not lost for good: once the job is free again, the next one
// comes an interval later. Before, a periodic round refused as busy left
// the job without periodic rounds from then on.
func TestPeriodicAfterBusy(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{Seed: 1, Delay: 50 * time.Millisecond}, coord.Options{})
	c1 := e.start()
	ctx := context.Background()
	const every = 300 * time.Millisecond
	if _, err := c1.RunJob(ctx, coordv1.RunJob{Name: "ring", Ranks: 2, PerNode: 1, Args: []string{"/bin/ring"}, CheckpointEvery: every}); err != nil {
		t.Fatal(err)
	}
	e.settled(c1, "ring", 10*time.Second)
	moves := 0
	for end := time.Now().Add(10 * every); time.Now().Before(end); moves++ {
		if m, err := c1.Migrate(ctx, "ring", coordv1.Migrate{Rank: 1}); err != nil || m.State != coordv1.MigrationDone {
			t.Fatalf("migration %d: %+v, %v", moves, m, err)
		}
	}
	busy, err := c1.Checkpoints(ctx, "ring")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d migrations, %d rounds between them", moves, len(busy))
	waitFor(t, 4*every+2*time.Second, "a periodic round after the busy time", func() bool {
		cks, err := c1.Checkpoints(ctx, "ring")
		return err == nil && len(cks) > len(busy)
	})
}
