package chaos

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/model"
)

// Record is what a run saw of its job, the input of Measure.
type Record struct {
	// From and To bound the measured window: From is the job's first
	// progress report once its first checkpoint was protected, when
	// failures began; To its last progress report counted (its last, or
	// the first once it ran again after the run's duration).
	From, To time.Time
	// Samples are rank 0's progress reports (messages handled so far).
	Samples []model.Sample
	// Ckpts are the job's checkpoint records.
	Ckpts []coordv1.Ckpt
	// Faults are the faults injected.
	Faults []Injected
	// Restarts are the job's restarts from its checkpoints.
	Restarts []Restart
}

// Injected is a fault as it was injected.
type Injected struct {
	Fault
	Time time.Time `json:"time"`
	// Hit: a failure of a node the job's ranks were placed on.
	Hit bool `json:"hit,omitempty"`
}

// Restart is one of the job's restarts, as the coordinator's events tell
// it: it began at Begun (job.restarting: its last attempt, if an earlier
// one failed), resumed every rank at Done, restored from checkpoint
// Ckpt, and took Took (job.restarted).
type Restart struct {
	Begun time.Time     `json:"begun"`
	Done  time.Time     `json:"done"`
	Ckpt  int           `json:"ckpt"`
	Took  time.Duration `json:"took_ns"`
}

// Measurement is what Measure found. Times are in seconds.
type Measurement struct {
	Wall float64 `json:"wall"` // To − From
	// Work is the messages the job handled over the window and kept:
	// its count at To minus its count at From.
	Work float64 `json:"work"`
	// Rate is r₀, the job's undisturbed rate (messages/s): each run's
	// between two restarts (model.Measure's, cairn report's), averaged
	// weighted by their lengths.
	Rate float64 `json:"rate"`
	// Useful is Work at Rate: the wall time of the same work without
	// failures and without checkpoints. ETTR is Useful / Wall.
	Useful float64 `json:"useful"`
	ETTR   float64 `json:"ettr"`

	Failures int `json:"failures"` // injected in the window
	Hits     int `json:"hits"`     // of those, of the job's nodes
	Restarts int `json:"restarts"` // the job's, in the window
	// Unexplained are the restarts that followed no failure injected:
	// the coordinator found a node of the job's dead that was not (its
	// heartbeats late on a loaded machine). They interrupted the job as
	// failures do, from its last progress report before them.
	Unexplained int `json:"unexplained"`
	// MTBF is the job's measured mean time between failures: Wall over
	// its interruptions, Hits + Unexplained (0: none).
	MTBF float64 `json:"mtbf"`
	// Cost is C, the mean cost of the window's durable rounds (their
	// stall plus the job's loss after the thaw and while copying, as
	// cairn report measures it), over Rounds of them.
	Cost   float64 `json:"cost"`
	Rounds int     `json:"rounds"`
	// Interval is the mean time between the starts of two consecutive
	// rounds of one run (τ + C), over Intervals pairs of them.
	Interval  float64 `json:"interval"`
	Intervals int     `json:"intervals"`
	// Restart is R, the mean time from a failure until the job is back,
	// at its rate, where its checkpoint left it, over the RestartsTimed
	// restarts that followed a single failure.
	Restart       float64 `json:"restart"`
	RestartsTimed int     `json:"restarts_timed"`
	// Compound are the restarts that followed several failures (a node
	// failing while the job restarted), and CompoundDown their mean
	// time from the first failure until the job was back.
	Compound     int     `json:"compound"`
	CompoundDown float64 `json:"compound_down"`
	// RestartTook is the mean time the coordinator's restarts took, from
	// their decision to every rank resumed (part of R, which also has
	// the failure's detection and the job's slow start after it).
	RestartTook float64 `json:"restart_took"`
	// Lost is the mean work lost per restart (in seconds at Rate): done
	// after the checkpoint restored, before the failure.
	Lost float64 `json:"lost"`
	// Where the wall time went: Useful, the rounds in the window at
	// Cost each (Ckpts), the work lost (LostTime), the time from each
	// restart's first failure (or interruption) until the job was back
	// (Down), and what none of these explain (Other: the job slower than
	// its rate at other times, restarts that could not be timed).
	Ckpts    float64 `json:"ckpts"`
	LostTime float64 `json:"lost_time"`
	Down     float64 `json:"down"`
	Other    float64 `json:"other"`
	// Predicted is the model's ETTR for Cost, Interval, Restart and
	// MTBF (Predict).
	Predicted float64  `json:"predicted"`
	Notes     []string `json:"notes,omitempty"`
}

// ErrTooShort says that a record holds too little to measure the job.
var ErrTooShort = errors.New("too little to measure")

// Predict is the model's ETTR (docs/planning.md, "The checkpoint
// interval") for rounds every interval seconds that each cost c, restarts
// of r and a job MTBF of m: the compute time between two checkpoints, τ =
// interval − c, over the expected time a segment of τ and its checkpoint
// takes with failures, e^(R/M)·M·(e^((τ+C)/M) − 1) (model.Expected). With
// m of 0 (no failure) it is τ/(τ + C).
func Predict(c, interval, r, m float64) float64 {
	tau := interval - c
	if tau <= 0 || c < 0 {
		return 0
	}
	if m <= 0 {
		return tau / interval
	}
	d := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	e := model.Expected(model.Scenario{Work: d(tau), Tau: d(tau), C: d(c), R: d(r), M: d(m)})
	if math.IsInf(e, 0) || e <= 0 {
		return 0
	}
	return tau / e
}

// run is the job between two restarts (an incarnation of it): the
// progress reports and rounds it saw, and what model.Measure found in
// them.
type run struct {
	start   time.Time
	samples []model.Sample
	rounds  []model.Round // begun in the run, in time order
	rate    float64       // r₀; 0: not measured
	span    float64
	terms   map[int]coordv1.CkptTerms // of the rounds it saw whole
	// restored is the count of the checkpoint the run began from (known:
	// set), as its restart was measured.
	restored float64
	known    bool
}

// Measure measures a run's ETTR and the figures the model predicts it
// from.
func Measure(rec Record) (Measurement, error) {
	var m Measurement
	if !rec.To.After(rec.From) {
		return m, fmt.Errorf("%w: an empty window", ErrTooShort)
	}
	m.Wall = rec.To.Sub(rec.From).Seconds()
	in := func(t time.Time) bool { return !t.Before(rec.From) && !t.After(rec.To) }
	samples := slices.Clone(rec.Samples)
	sort.SliceStable(samples, func(a, b int) bool { return samples[a].At.Before(samples[b].At) })
	restarts := slices.Clone(rec.Restarts)
	sort.Slice(restarts, func(a, b int) bool { return restarts[a].Done.Before(restarts[b].Done) })
	ckpts := map[int]coordv1.Ckpt{}
	var rounds []model.Round
	for _, ck := range rec.Ckpts {
		ckpts[ck.Seq] = ck
		if ck.Stall > 0 {
			r := model.RoundOf(ck)
			// The first span of copies is the round's own replication;
			// later ones repair copies a failure took, a cost of that
			// failure rather than of the checkpoint.
			r.Copies = r.Copies[:min(len(r.Copies), 1)]
			rounds = append(rounds, r)
		}
	}
	sort.Slice(rounds, func(a, b int) bool { return rounds[a].Start.Before(rounds[b].Start) })

	// The runs between restarts, each measured as cairn report does.
	runs := []*run{{}}
	for _, r := range restarts {
		runs = append(runs, &run{start: r.Done})
	}
	runOf := func(t time.Time) *run {
		i := sort.Search(len(runs), func(i int) bool { return runs[i].start.After(t) })
		return runs[max(i-1, 0)]
	}
	for _, s := range samples {
		ru := runOf(s.At)
		ru.samples = append(ru.samples, s)
	}
	for _, r := range rounds {
		ru := runOf(r.Start)
		ru.rounds = append(ru.rounds, r)
	}
	var weighted, spans float64
	for _, ru := range runs {
		if len(ru.samples) == 0 {
			continue
		}
		first, last := ru.samples[0].At, ru.samples[len(ru.samples)-1].At
		ov, terms := model.Measure(model.Input{From: first, To: last, Rounds: ru.rounds, Samples: ru.samples})
		if !ov.Checked || ov.Progress == nil || ov.Progress.Rate <= 0 {
			continue
		}
		ru.rate, ru.span = ov.Progress.Rate, ov.Run
		weighted += ru.rate * ru.span
		spans += ru.span
		ru.terms = map[int]coordv1.CkptTerms{}
		for i, t := range terms {
			// Only rounds the run saw whole: begun after its first
			// report, stored, copied and recovered from before its last.
			// (Measure's terms are in the order of its rounds.)
			r := ru.rounds[i]
			if r.Start.Before(first) || r.Durable.IsZero() || done(r).After(last) {
				continue
			}
			ru.terms[t.Seq] = t
		}
	}
	if spans == 0 {
		return m, fmt.Errorf("%w: no stretch between restarts with progress reports enough to measure the job's rate (at least %d reports, %d intervals between them untouched by checkpoints)", ErrTooShort, model.MinSamples, model.MinQuiet)
	}
	m.Rate = weighted / spans
	rateOf := func(ru *run) float64 {
		if ru.rate > 0 {
			return ru.rate
		}
		return m.Rate
	}

	// The work kept over the window, and the ETTR.
	c0, ok0 := countAt(samples, rec.From)
	c1, ok1 := countAt(samples, rec.To)
	if !ok0 || !ok1 {
		return m, fmt.Errorf("%w: no progress report at the window's start or end", ErrTooShort)
	}
	m.Work = c1 - c0
	m.Useful = m.Work / m.Rate
	m.ETTR = m.Useful / m.Wall

	var hits []time.Time
	for _, f := range rec.Faults {
		if f.Kind != Fail || !in(f.Time) {
			continue
		}
		m.Failures++
		if f.Hit {
			m.Hits++
			hits = append(hits, f.Time)
		}
	}
	slices.SortFunc(hits, time.Time.Compare)

	// C: the mean cost of the window's rounds each run saw whole; τ + C:
	// the spacing of the window's rounds within a run.
	var cost, gaps float64
	for _, ru := range runs {
		for _, t := range ru.terms {
			if in(t.Start) {
				cost += t.Cost
				m.Rounds++
			}
		}
		for i := 1; i < len(ru.rounds); i++ {
			if a, b := ru.rounds[i-1].Start, ru.rounds[i].Start; in(a) && in(b) {
				gaps += b.Sub(a).Seconds()
				m.Intervals++
			}
		}
		for _, r := range ru.rounds {
			if in(r.Start) {
				m.Ckpts++ // times C, below
			}
		}
	}
	if m.Rounds == 0 {
		return m, fmt.Errorf("%w: no durable round measured in the window", ErrTooShort)
	}
	if m.Intervals == 0 {
		return m, fmt.Errorf("%w: no two consecutive rounds in one run", ErrTooShort)
	}
	m.Cost = cost / float64(m.Rounds)
	m.Interval = gaps / float64(m.Intervals)
	m.Ckpts *= m.Cost

	// R, and the work lost: from each restart's failures, the checkpoint
	// it restored and the progress of the run it began.
	var rsum, lsum, took, csum float64
	lostN, h := 0, 0
	// The failures of a restart whose run made no progress report before
	// the next failure: the job was not back, and the interruption goes
	// on to the next restart.
	var carry []time.Time
	carryInjected := false
	for k, r := range restarts {
		cause := carry // the failures since the run before it began
		for ; h < len(hits) && hits[h].Before(r.Done); h++ {
			if !hits[h].Before(runs[k].start) {
				cause = append(cause, hits[h])
			}
		}
		injected := carryInjected || len(cause) > len(carry)
		carry, carryInjected = nil, false
		if !in(r.Done) {
			continue
		}
		m.Restarts++
		took += r.Took.Seconds()
		if len(cause) == 0 {
			// An interruption not injected: from the job's last report
			// before the restart began.
			m.Unexplained++
			m.Notes = append(m.Notes, fmt.Sprintf("the restart at %s from checkpoint %d followed no failure injected: the coordinator found a node of the job's dead that was not", r.Done.Format(time.TimeOnly), r.Ckpt))
			began := r.Begun
			if began.IsZero() {
				began = r.Done.Add(-r.Took)
			}
			at := began
			if last, _ := around(runs[k].samples, began); last != nil {
				at = last.At
			}
			cause = []time.Time{at}
		}
		resume, lost, restored, err := restartTimes(ckpts[r.Ckpt], runOf, runs[k+1], rateOf, cause[0])
		if errors.Is(err, errNotBack) && k+1 < len(restarts) {
			carry, carryInjected = cause, injected
			continue
		}
		if err != nil {
			m.Notes = append(m.Notes, fmt.Sprintf("the restart from checkpoint %d: %v", r.Ckpt, err))
			continue
		}
		runs[k+1].restored, runs[k+1].known = restored, true
		down := resume.Sub(cause[0]).Seconds()
		m.Down += down
		m.LostTime += lost
		lsum += lost
		lostN++
		switch {
		case !injected:
			// When the coordinator found the node dead is not known: R
			// is not timed on it.
		case len(cause) > 1:
			m.Compound++
			csum += down
		default:
			rsum += down
			m.RestartsTimed++
		}
	}
	if n := m.Hits + m.Unexplained; n > 0 {
		m.MTBF = m.Wall / float64(n)
	}
	if m.Compound > 0 {
		m.CompoundDown = csum / float64(m.Compound)
	}
	if m.Restarts > 0 {
		m.RestartTook = took / float64(m.Restarts)
	}
	if lostN > 0 {
		m.Lost = lsum / float64(lostN)
	}
	if m.RestartsTimed > 0 {
		m.Restart = rsum / float64(m.RestartsTimed)
	}
	m.Other = m.Wall - m.Useful - m.Ckpts - m.LostTime - m.Down

	switch {
	case m.MTBF == 0:
		m.Notes = append(m.Notes, "no failure hit the job: the prediction is τ/(τ+C)")
		m.Predicted = Predict(m.Cost, m.Interval, 0, 0)
	case m.RestartsTimed == 0:
		m.Notes = append(m.Notes, "no restart could be timed: no prediction")
	default:
		m.Predicted = Predict(m.Cost, m.Interval, m.Restart, m.MTBF)
	}
	return m, nil
}

// errNotBack is restartTimes's answer for a restart whose run made no
// progress report: the job failed again before it was back.
var errNotBack = errors.New("no progress report after it")

// restartTimes finds when the run ru, begun by a restart from checkpoint
// ck after a failure at failed, was back where ck left the job, as if it
// had run at its rate from then on (resume), how much work, in seconds at
// the rate, the failure lost (what the job had done after ck), and ck's
// count.
func restartTimes(ck coordv1.Ckpt, runOf func(time.Time) *run, ru *run, rateOf func(*run) float64,
	failed time.Time) (resume time.Time, lost, pS float64, err error) {
	if ck.Seq == 0 {
		return time.Time{}, 0, 0, errors.New("no record of the checkpoint")
	}
	// The count at the checkpoint: its run's last report before the
	// round, carried on at that run's rate to the round's start (the
	// ranks were frozen from there), and never past its next report. A
	// run that reported nothing before the round had not moved since its
	// own restart: the count it began from.
	at := runOf(ck.Created)
	before, after := around(at.samples, ck.Created)
	switch {
	case before != nil:
		pS = before.Count + rateOf(at)*ck.Created.Sub(before.At).Seconds()
	case at.known:
		pS = at.restored
	default:
		return time.Time{}, 0, 0, errors.New("no progress report before the checkpoint")
	}
	if after != nil {
		pS = min(pS, after.Count)
	}
	// The new run's last report before its first round (or its last):
	// how far it got, at its rate, since it was back at the checkpoint.
	var s *model.Sample
	for k := range ru.samples {
		if len(ru.rounds) == 0 || ru.samples[k].At.Before(ru.rounds[0].Start) {
			s = &ru.samples[k]
		}
	}
	if s == nil {
		return time.Time{}, 0, 0, errNotBack
	}
	// The count carried on at the rate can overshoot, by what the job did
	// slower before the round: the checkpoint held no more than the job
	// reported once restored from it.
	pS = min(pS, s.Count)
	// The work lost: what the job had done when the failure came (its
	// last report, carried on at its rate until the failure or a round
	// that froze it), less the checkpoint's count.
	hit := runOf(failed)
	if last, _ := around(hit.samples, failed); last != nil {
		until := failed
		for _, r := range hit.rounds {
			if r.Start.After(last.At) && r.Start.Before(until) {
				until = r.Start
			}
		}
		lost = max(0, (last.Count-pS)/rateOf(hit)+until.Sub(last.At).Seconds())
	}
	back := (s.Count - pS) / rateOf(ru)
	return s.At.Add(-time.Duration(back * float64(time.Second))), lost, pS, nil
}

// done is when a round stopped costing the job: its images stored, its
// TCP connections recovered (model.TCPRecovery after a stall's length),
// its copies made.
func done(r model.Round) time.Time {
	thaw := r.Start.Add(r.Stall)
	t := thaw.Add(r.Stall + model.TCPRecovery)
	if r.Durable.After(t) {
		t = r.Durable
	}
	for _, c := range r.Copies {
		if c.To.After(t) {
			t = c.To
		}
	}
	return t
}

// around returns the last sample at or before t and the first after it
// (nil: none).
func around(samples []model.Sample, t time.Time) (before, after *model.Sample) {
	for k := range samples {
		s := &samples[k]
		if !s.At.After(t) {
			before = s
		} else if after == nil {
			after = s
		}
	}
	return before, after
}

// countAt is the count of the report at t, exactly.
func countAt(samples []model.Sample, t time.Time) (float64, bool) {
	for _, s := range samples {
		if s.At.Equal(t) {
			return s.Count, true
		}
	}
	return 0, false
}
