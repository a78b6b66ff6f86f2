package coord

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/events"
	"github.com/cairn-hpc/cairn/internal/model"
)

// Automatic checkpoint intervals (RunJob.CheckpointAuto): the coordinator
// chooses a job's interval by Daly's formula from its measured checkpoint
// cost and its MTBF (model.Decide), before its first round from the
// default cost, and again after every durable round; a change of more
// than model.Hysteresis is recorded in the job (Job.Interval) and
// published (job.interval).

// intervals chooses the automatic checkpoint intervals of jobs.
type intervals struct{ c *Coordinator }

// checkAuto refuses an automatic interval that has no MTBF to go by.
func (ivs *intervals) checkAuto(ctx context.Context, req coordv1.RunJob) error {
	c := ivs.c
	switch {
	case req.MTBF < 0:
		return apiErr(agentv1.CodeBadRequest, "mtbf must not be negative")
	case req.CheckpointEvery < 0:
		return apiErr(agentv1.CodeBadRequest, "checkpoint-every must not be negative")
	case !req.CheckpointAuto:
		return nil
	case req.CheckpointEvery > 0:
		return apiErr(agentv1.CodeBadRequest, "an automatic interval and a fixed one exclude each other")
	}
	if m := model.MTBF(req.MTBF, c.opts.MTBF, c.rec.failures(ctx), 1); m.Node <= 0 {
		return apiErr(agentv1.CodeBadRequest, "an automatic interval needs an MTBF: the job's --mtbf, the coordinator's --mtbf, or %d node failures seen for an estimate", model.MinFailures)
	}
	return nil
}

// reviewInterval chooses a job's automatic interval again, and records
// and publishes it if it changed enough. It returns the interval in
// force.
func (ivs *intervals) reviewInterval(ctx context.Context, name string) *coordv1.Interval {
	c := ivs.c
	f, err := ivs.reportFacts(ctx, name)
	if err != nil || !f.Job.CheckpointAuto {
		return nil
	}
	next := model.Decide(f, time.Now().UTC())
	if next == nil {
		c.log.Debug("no MTBF for the job's automatic interval", "job", name)
		return f.Job.Interval
	}
	var old *coordv1.Interval
	j, err := c.rec.updateJob(ctx, name, func(j *coordv1.Job) error {
		old = j.Interval
		if old != nil && !model.Changed(old.Every, next.Every) {
			return errUnchanged
		}
		j.Interval = next
		return nil
	})
	if errors.Is(err, errUnchanged) {
		return old
	}
	if err != nil {
		c.log.Warn("record the job's interval", "job", name, "err", err)
		return old
	}
	why := fmt.Sprintf("%s; C: %s; M: %s", intervalLine(next), next.CostBasis, next.MTBFBasis)
	if old != nil {
		why = fmt.Sprintf("was every %s; now %s", old.Every.Round(time.Millisecond), why)
	}
	c.log.Info("checkpoint interval", "job", name, "every", next.Every, "cost", next.Cost, "mtbf", next.MTBF)
	c.publish(evv1.Event{Type: evv1.JobInterval, Job: name, Duration: next.Every, Message: why})
	return j.Interval
}

// errUnchanged leaves a record as it is.
var errUnchanged = errors.New("unchanged")

func intervalLine(iv *coordv1.Interval) string {
	return model.Choice{Every: iv.Every, Tau: iv.Tau, Young: iv.Young, Cost: iv.Cost, MTBF: iv.MTBF, Formula: iv.Formula}.String()
}

// reportFacts gathers what a job's report and interval are made from.
func (ivs *intervals) reportFacts(ctx context.Context, name string) (model.Facts, error) {
	c := ivs.c
	j, err := c.rec.job(ctx, name)
	if err != nil {
		return model.Facts{}, err
	}
	f := model.Facts{Job: *j, Now: time.Now().UTC()}
	if f.Ckpts, err = c.rec.ckpts(ctx, name); err != nil {
		return f, err
	}
	if f.Migrations, err = listBySeq(ctx, c, migPrefix(name), func(m coordv1.Migration) int { return m.Seq }); err != nil {
		return f, err
	}
	f.Events = c.opts.Events.History(events.Filter{Job: name, Type: evv1.RankEvent})
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return f, err
	}
	for n := range live {
		f.Live = append(f.Live, n)
	}
	sort.Strings(f.Live)
	f.MTBF = model.MTBF(j.MTBF, c.opts.MTBF, c.rec.failures(ctx), model.Nodes(*j))
	return f, nil
}
