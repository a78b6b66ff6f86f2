package model

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
	"github.com/cairn-hpc/cairn/internal/plan"
)

// Facts are what the coordinator knows of a job for its report.
type Facts struct {
	Job        coordv1.Job
	Ckpts      []coordv1.Ckpt
	Migrations []coordv1.Migration
	// Events are the job's rank events still in the coordinator's
	// history: the progress reports among them are used.
	Events []evv1.Event
	Live   []string // the cluster's live nodes
	MTBF   coordv1.MTBF
	Now    time.Time
}

// MaxFailures is the most simultaneous failures a report gives the
// restart probability for.
const MaxFailures = 3

// Report makes a job's report.
func Report(f Facts) coordv1.Report {
	j := f.Job
	r := coordv1.Report{Job: j.Name, State: j.State, At: f.Now, Ranks: j.Ranks, Nodes: Nodes(j), Replicas: j.Replicas,
		MTBF: f.MTBF, Every: j.CheckpointEvery, Interval: j.Interval}
	if j.CheckpointAuto && j.Interval != nil {
		r.Every = j.Interval.Every
	}
	in := InputOf(f)
	r.Model, r.Ckpts = Measure(in)
	for _, ck := range f.Ckpts {
		var spans []window
		for _, c := range ck.Copied {
			r.Replication.Copies += c.Copies
			r.Replication.Bytes += c.Bytes
			spans = append(spans, window{from: c.From.Sub(ck.Created).Seconds(), to: c.To.Sub(ck.Created).Seconds()})
		}
		r.Replication.Time += unionLen(spans)
	}
	r.Restart = restartOdds(f)
	return r
}

// InputOf is the model's input from what the coordinator knows: the
// rounds that froze the job's ranks, its migrations' stalls, and the
// progress of the rank that reported most.
func InputOf(f Facts) Input {
	in := Input{From: f.Job.Created, To: f.Now}
	switch f.Job.State {
	case coordv1.JobRunning, coordv1.JobStarting, coordv1.JobRestarting:
	default:
		// Ended: up to the last thing known of it.
		in.To = f.Job.Created
		for _, ck := range f.Ckpts {
			in.To = later(in.To, ck.Finished)
		}
	}
	for _, ck := range f.Ckpts {
		if ck.Stall > 0 {
			in.Rounds = append(in.Rounds, RoundOf(ck))
		}
	}
	for _, m := range f.Migrations {
		if m.Stall > 0 {
			in.Stalls = append(in.Stalls, Span{From: m.Started, To: m.Started.Add(m.Stall)})
		}
	}
	byRank := map[int][]Sample{}
	for _, e := range f.Events {
		if e.Type != evv1.RankEvent || e.Kind != rankv1.KindProgress || e.Rank == nil {
			continue
		}
		n, err := strconv.ParseFloat(e.Message, 64)
		if err != nil {
			continue
		}
		byRank[*e.Rank] = append(byRank[*e.Rank], Sample{At: e.Time, Count: n})
	}
	best := -1
	for rank, s := range byRank {
		if best < 0 || len(s) > len(byRank[best]) || len(s) == len(byRank[best]) && rank < best {
			best = rank
		}
	}
	if best >= 0 {
		in.Rank, in.Samples = best, byRank[best]
		sort.SliceStable(in.Samples, func(a, b int) bool { return in.Samples[a].At.Before(in.Samples[b].At) })
		if !f.Now.IsZero() && in.To.Before(in.Samples[len(in.Samples)-1].At) {
			in.To = in.Samples[len(in.Samples)-1].At
		}
	}
	return in
}

// Nodes is how many nodes a job's ranks run on.
func Nodes(j coordv1.Job) int {
	return len(slices.Compact(slices.Sorted(slices.Values(j.Placement))))
}

// restartOdds is the probability of a restart after 1..MaxFailures
// failures: over where the copies of the newest restorable checkpoint
// are among the live nodes, and by cairn plan for the job's nodes and
// replicas.
func restartOdds(f Facts) []coordv1.RestartOdds {
	index := map[string]int{}
	for _, n := range f.Live {
		if _, ok := index[n]; !ok {
			index[n] = len(index)
		}
	}
	var sets [][]int
	for i := len(f.Ckpts) - 1; i >= 0 && sets == nil; i-- {
		ck := f.Ckpts[i]
		if ck.State != coordv1.CkptDurable && ck.State != coordv1.CkptProtected {
			continue
		}
		var ss [][]int
		whole := true
		for _, r := range ck.Ranks {
			var s []int
			copies := r.Copies
			if len(copies) == 0 {
				copies = []string{r.Node}
			}
			for _, n := range copies {
				if x, ok := index[n]; ok {
					s = append(s, x)
				}
			}
			if len(s) == 0 {
				whole = false
				break
			}
			ss = append(ss, s)
		}
		if whole {
			sets = ss
		}
	}
	nodes := Nodes(f.Job)
	var out []coordv1.RestartOdds
	for k := 1; k <= MaxFailures; k++ {
		o := coordv1.RestartOdds{Failures: k}
		if sets != nil && k <= len(index) {
			if p, err := plan.Sets(len(index), k, sets); err == nil {
				o.Copies = &p
			}
		}
		if p, err := plan.Exact(nodes, f.Job.Replicas, k, plan.Ring); err == nil {
			o.Plan = &p
		}
		out = append(out, o)
	}
	return out
}

// RecentRounds is how many of a job's newest durable rounds give its
// checkpoint cost.
const RecentRounds = 5

// Cost is a job's checkpoint cost C for its interval: the median cost of
// its RecentRounds newest durable rounds (each its stall, plus its loss
// after the thaw and while copying if the job reports progress), or
// DefaultCost before any; basis says which.
func Cost(terms []coordv1.CkptTerms, progress bool) (c time.Duration, basis string) {
	var costs []float64
	for i := len(terms) - 1; i >= 0 && len(costs) < RecentRounds; i-- {
		if t := terms[i]; t.State == coordv1.CkptDurable || t.State == coordv1.CkptProtected {
			costs = append(costs, t.Cost)
		}
	}
	if len(costs) == 0 {
		return DefaultCost, fmt.Sprintf("default %s: no round measured yet", DefaultCost)
	}
	med := median(costs)
	what := "stall (the job reports no progress: its loss after the thaw is not seen)"
	if progress {
		what = "stall plus the job's loss after the thaw and while copying, from its progress"
	}
	if len(costs) == 1 {
		return seconds(med), "the last durable round's " + what
	}
	return seconds(med), fmt.Sprintf("median of the last %d durable rounds' %s", len(costs), what)
}

// Decide chooses a job's automatic interval from what its report
// measured and the MTBF known; nil if no MTBF is.
func Decide(f Facts, now time.Time) *coordv1.Interval {
	if f.MTBF.Job <= 0 {
		return nil
	}
	ov, terms := Measure(InputOf(f))
	c, cb := Cost(terms, ov.Checked)
	ch := Choose(c, f.MTBF.Job)
	return &coordv1.Interval{Every: ch.Every, Tau: ch.Tau, Young: ch.Young, Cost: ch.Cost, CostBasis: cb,
		MTBF: f.MTBF.Job, MTBFBasis: Basis(f.MTBF, Nodes(f.Job)), Formula: ch.Formula, At: now}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
