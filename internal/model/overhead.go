package model

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
)

// Round is one checkpoint round as the model takes it from its record.
type Round struct {
	Seq   int
	State coordv1.CkptState
	Start time.Time     // the round began: its ranks are frozen from here
	Stall time.Duration // for this long
	Coord time.Duration // t_coord: Stall minus the slowest rank's prepare
	Cont  time.Duration // t_cont: the slowest prepare minus its CRIU dump
	// Durable is when every image was stored (zero: never).
	Durable time.Time
	Copies  []coordv1.CopySpan
	Bytes   int64
}

// RoundOf is the Round of a checkpoint record.
func RoundOf(ck coordv1.Ckpt) Round {
	r := Round{Seq: ck.Seq, State: ck.State, Start: ck.Created, Stall: ck.Stall, Coord: ck.Coord, Cont: ck.Cont,
		Copies: ck.Copied, Bytes: ck.Bytes}
	if ck.State == coordv1.CkptDurable || ck.State == coordv1.CkptProtected {
		r.Durable = ck.Finished
	}
	return r
}

// Sample is a progress report of a job: Count units of work done at At.
type Sample struct {
	At    time.Time
	Count float64
}

// Span is a stretch of time.
type Span struct{ From, To time.Time }

// Input is what the model measures a job's overhead from.
type Input struct {
	// From and To bound the job's run so far: its start, and now (or
	// its end).
	From, To time.Time
	Rounds   []Round
	// Stalls are the other times the job's ranks were frozen
	// (migrations).
	Stalls []Span
	// Samples are one rank's progress reports, in time order; Rank is
	// that rank.
	Samples []Sample
	Rank    int
}

// Thresholds of the progress analysis.
const (
	// MinSamples is the fewest progress reports the model measures from.
	MinSamples = 5
	// MinQuiet is the fewest intervals between reports, untouched by
	// rounds, stores and copies, that give the undisturbed rate.
	MinQuiet = 2
	// ClockNoise is how far the records' times of a round may be from
	// when its ranks actually froze and thawed: the coordinator times a
	// round from its start to its commit message, and the ranks freeze
	// and thaw a message later (a few ms; docs/benchmarks.md).
	ClockNoise = 10 * time.Millisecond
	// TCPRecovery and the stall before it are how long after a thaw the
	// job's TCP connections may wait for their next retransmission: the
	// network lock dropped what they sent while the ranks were frozen,
	// and the kernel's retransmission timer backs off, doubling from 200
	// ms, so the next one comes at most about the stall plus 200 ms
	// later. The window after a thaw lasts at least that long.
	TCPRecovery = 200 * time.Millisecond
	// MaxAlpha bounds α when the job hardly progressed while copies ran.
	MaxAlpha = 20
	// MaxRateErr is the largest standard error, relative to the
	// undisturbed rate, of the rates while images are stored and while
	// they are copied for the two to be measured apart (and α with
	// them).
	MaxRateErr = 0.25
)

// Window classes of the timeline, in order of precedence: a time both in
// a stall and a store counts as stall.
const (
	stall = iota
	after // the thaw until every image is stored, and TCP has recovered
	copying
	nClass
)

// window is a stretch of one class, of round (−1: no round).
type window struct {
	from, to float64 // seconds since the span's start
	class    int
	round    int
}

// Measure computes the job's terms (docs/planning.md, "The overhead of a
// job"). With MinSamples progress reports or more, over the span they
// cover, t_comp and t_comm are the work they report at the job's
// undisturbed rate, α and t_after come from its rates while copies ran
// and while images were stored, and the residual checks the sum. Without,
// over [From, To], t_comp is the run minus the stalls and the residual is
// zero by construction.
func Measure(in Input) (coordv1.Overhead, []coordv1.CkptTerms) {
	rounds := slices.Clone(in.Rounds)
	sort.Slice(rounds, func(a, b int) bool { return rounds[a].Start.Before(rounds[b].Start) })
	samples := lastRun(in.Samples)
	ov := coordv1.Overhead{From: in.From, To: in.To, Alpha: 1}
	if len(samples) >= MinSamples {
		ov.From, ov.To = samples[0].At, samples[len(samples)-1].At
	}
	if !ov.To.After(ov.From) {
		ov.To = ov.From
	}
	ov.Run = ov.To.Sub(ov.From).Seconds()
	wins := timeline(ov.From, ov.To, rounds, in.Stalls)

	terms := make([]coordv1.CkptTerms, len(rounds))
	for i, r := range rounds {
		t := &terms[i]
		t.Seq, t.State, t.Start, t.Bytes = r.Seq, r.State, r.Start, r.Bytes
		t.Stall, t.TCoord, t.TCont = r.Stall.Seconds(), r.Coord.Seconds(), r.Cont.Seconds()
		t.TWrite = max(t.Stall-t.TCoord-t.TCont, 0)
		if !r.Durable.IsZero() {
			t.Ingest = max(r.Durable.Sub(r.Start).Seconds()-t.Stall, 0)
		}
		var cs []window
		for _, c := range r.Copies {
			t.CopyBytes += c.Bytes
			cs = append(cs, window{from: c.From.Sub(r.Start).Seconds(), to: c.To.Sub(r.Start).Seconds()})
		}
		t.CopyTime = unionLen(cs)
		t.Cost = t.Stall
	}
	// The rounds' share of the span: a stall cut by its edge counts by
	// the part inside.
	var stalled float64
	for i := range rounds {
		in := classIn(wins, i, stall)
		if in <= 0 {
			continue
		}
		f := in / math.Max(terms[i].Stall, 1e-9)
		ov.N++
		ov.TCoord += f * terms[i].TCoord
		ov.TWrite += f * terms[i].TWrite
		ov.TCont += f * terms[i].TCont
		stalled += in
	}
	ov.TOther = classIn(wins, -1, stall)
	if ov.N > 0 {
		ov.TCoord /= float64(ov.N)
		ov.TWrite /= float64(ov.N)
		ov.TCont /= float64(ov.N)
	}

	if !measureProgress(&ov, samples, wins, rounds, terms, in.Rank) {
		ov.TComp = ov.Run - stalled - ov.TOther
		ov.TComm, ov.Alpha, ov.TAfter = 0, 1, 0
		ov.Total = ov.Run
		ov.Within = true
		if ov.AlphaBasis == "" {
			ov.AlphaBasis = "not measured: the job reports no progress (rank events of kind progress)"
		}
		ov.Notes = append(ov.Notes, "t_comp is the run time minus the stalls, so the terms add up by construction; the job's slow-down after each thaw and while copies run is not seen")
	}
	if work := ov.TComp + ov.TComm; work > 0 {
		ov.OverheadPct = 100 * (ov.Total - work) / work
	}
	return ov, terms
}

// measureProgress fills the progress-based terms of ov and terms from
// samples, if they allow it.
func measureProgress(ov *coordv1.Overhead, samples []Sample, wins []window, rounds []Round, terms []coordv1.CkptTerms, rank int) bool {
	if len(samples) < MinSamples {
		if len(samples) > 0 {
			ov.Notes = append(ov.Notes, fmt.Sprintf("only %d progress reports (at least %d needed)", len(samples), MinSamples))
		}
		return false
	}
	t0 := samples[0].At
	type iv struct {
		dt, dp float64
		in     [nClass]float64
		quiet  bool
	}
	ivs := make([]iv, 0, len(samples)-1)
	first := 0
	for i := 1; i < len(samples); i++ {
		a, b := samples[i-1].At.Sub(t0).Seconds(), samples[i].At.Sub(t0).Seconds()
		v := iv{dt: b - a, dp: samples[i].Count - samples[i-1].Count}
		if v.dt <= 0 {
			continue
		}
		for first < len(wins) && wins[first].to <= a {
			first++ // wins are in time order and do not overlap
		}
		for _, w := range wins[first:] {
			if w.from >= b {
				break
			}
			v.in[w.class] += overlap(a, b, w.from, w.to)
		}
		v.quiet = v.in[stall]+v.in[after]+v.in[copying] < 1e-6
		ivs = append(ivs, v)
	}
	var qdt, qdp float64
	nq := 0
	for _, v := range ivs {
		if v.quiet {
			qdt += v.dt
			qdp += v.dp
			nq++
		}
	}
	if nq < MinQuiet || qdp <= 0 {
		ov.Notes = append(ov.Notes, fmt.Sprintf("%d intervals between progress reports untouched by checkpoints (at least %d needed)", nq, MinQuiet))
		return false
	}
	// The undisturbed rate is the median of the quiet intervals' rates,
	// not their mean: a loss outside every window (the job slowed by
	// something no term names) then shows in the residual instead of
	// lowering the rate.
	var rates []float64
	for _, v := range ivs {
		if v.quiet {
			rates = append(rates, v.dp/v.dt)
		}
	}
	r0 := median(rates)
	if r0 <= 0 {
		ov.Notes = append(ov.Notes, "the job made no progress while undisturbed")
		return false
	}
	var dev, rms, nrms float64
	for _, v := range ivs {
		if v.quiet {
			d := v.dp/v.dt - qdp/qdt
			dev += v.dt * d * d
		} else {
			rms += v.dt * v.dt
			nrms++
		}
	}
	noise := math.Sqrt(dev/qdt) / r0

	// Least squares over the disturbed intervals: what they did beyond
	// their quiet part, at rA while images were stored and rC while
	// copies ran (nothing while frozen).
	var saa, sac, scc, say, scy, atot, ctot float64
	for _, v := range ivs {
		if v.quiet {
			continue
		}
		q := v.dt - v.in[stall] - v.in[after] - v.in[copying]
		y := v.dp - r0*q
		a, c := v.in[after], v.in[copying]
		saa += a * a
		sac += a * c
		scc += c * c
		say += a * y
		scy += c * y
		atot += a
		ctot += c
	}
	// The store's and the copies' rates apart, if the intervals tell them
	// apart (each known to within MaxRateErr of r0); else one rate for
	// both: the copies' effect then counts in t_after, and α is not
	// measured.
	sigma := noise * r0 * math.Sqrt(rms/math.Max(nrms, 1)) // one interval's noise, in units
	var rA, rC, seC float64
	apart := false
	if det := saa*scc - sac*sac; saa > 0 && scc > 0 && det > 1e-12*saa*scc {
		rA = (say*scc - scy*sac) / det
		rC = (scy*saa - say*sac) / det
		seC = sigma * math.Sqrt(saa/det)
		apart = seC <= MaxRateErr*r0 && sigma*math.Sqrt(scc/det) <= MaxRateErr*r0
	} else if saa == 0 && scc > 0 {
		rC = scy / scc
		seC = sigma / math.Sqrt(scc)
		apart = seC <= MaxRateErr*r0
	}
	if !apart {
		if n := saa + scc + 2*sac; n > 0 {
			rA = (say + scy) / n
		}
		rC = rA
	}
	rA, rC = max(rA, 0), max(rC, 0)

	p := samples[len(samples)-1].Count - samples[0].Count
	ov.Checked = true
	ov.Progress = &coordv1.Progress{Rank: rank, Samples: len(samples), Units: p, Rate: r0, Noise: noise, RateAfter: rA, RateCopy: rC}
	total := classIn(wins, -2, copying)
	afterTotal := classIn(wins, -2, after)
	switch {
	case total <= 0:
		ov.AlphaBasis = "no copies were made in the span: α is 1"
	case !apart:
		ov.AlphaBasis = fmt.Sprintf("not measured: copies ran %.2f s in all, too briefly to tell their effect from the store's and the noise (within %.0f%%); it counts in t_after", total, 100*MaxRateErr)
		afterTotal += total
	default:
		rc := max(rC, r0/MaxAlpha)
		ov.Alpha = r0 / rc
		ov.Progress.AlphaErr = ov.Alpha * seC / rc
		ov.AlphaBasis = fmt.Sprintf("rank %d's progress rate without (%.4g/s) and with copies running (%.4g/s over %.1f s)", rank, r0, rC, total)
		if rC < rc {
			ov.AlphaBasis = fmt.Sprintf("the job made almost no progress in the %.1f s copies ran: α capped at %d", total, MaxAlpha)
		}
	}
	// α·t_comm is the time copies ran beside the job, t_comm the work
	// done meanwhile at the undisturbed rate.
	ov.TComm = total / ov.Alpha
	if !apart {
		ov.TComm = rC * total / r0
	}
	ov.TAfter = afterTotal * (1 - rA/r0)
	ov.TComp = (p - ov.TComm*r0) / r0
	for i := range rounds {
		a, c := classIn(wins, i, after), classIn(wins, i, copying)
		if apart {
			terms[i].TAfter = a * (1 - rA/r0)
			terms[i].TCopy = c * (1 - 1/ov.Alpha)
		} else {
			terms[i].TAfter = (a + c) * (1 - rA/r0)
		}
		terms[i].Cost = terms[i].Stall + max(terms[i].TAfter, 0) + max(terms[i].TCopy, 0)
	}
	stalls := classIn(wins, -2, stall)
	ov.Total = ov.TComp + ov.Alpha*ov.TComm + stalls + ov.TAfter
	ov.Residual = ov.Run - ov.Total
	// Three standard deviations of the residual if every interval's rate
	// is off by about noise, independently and normally: the m quiet
	// intervals leave their time times 1 − mean/median of their rates,
	// of standard deviation sqrt(π/2 − 1)·noise/sqrt(m); each of the
	// others leaves what the fit does not explain, at most about
	// noise·dt. The records' times add ClockNoise a round.
	quiet := math.Sqrt(math.Pi/2-1) * noise * qdt / math.Sqrt(float64(nq))
	others := noise * math.Sqrt(rms)
	ov.Tolerance = 3*math.Hypot(quiet, others) + float64(ov.N)*ClockNoise.Seconds()
	ov.Within = math.Abs(ov.Residual) <= ov.Tolerance
	return true
}

// lastRun is the samples after the last time the count went down (a
// restart from a checkpoint), without repeated times.
func lastRun(s []Sample) []Sample {
	start := 0
	for i := 1; i < len(s); i++ {
		if s[i].Count < s[i-1].Count || s[i].At.Before(s[i-1].At) {
			start = i
		}
	}
	var out []Sample
	for _, x := range s[start:] {
		if len(out) > 0 && !x.At.After(out[len(out)-1].At) {
			continue
		}
		out = append(out, x)
	}
	return out
}

// timeline cuts [from, to] into windows of one class each: every time
// belongs to at most one window, the first class that holds it.
func timeline(from, to time.Time, rounds []Round, stalls []Span) []window {
	var raw []window
	rel := func(t time.Time) float64 { return t.Sub(from).Seconds() }
	for i, r := range rounds {
		thaw := r.Start.Add(r.Stall)
		raw = append(raw, window{rel(r.Start), rel(thaw), stall, i})
		end := thaw.Add(r.Stall + TCPRecovery)
		if r.Durable.After(end) {
			end = r.Durable
		}
		raw = append(raw, window{rel(thaw), rel(end), after, i})
		for _, c := range r.Copies {
			raw = append(raw, window{rel(c.From), rel(c.To), copying, i})
		}
	}
	for _, s := range stalls {
		raw = append(raw, window{rel(s.From), rel(s.To), stall, -1})
	}
	end := to.Sub(from).Seconds()
	// Sweep the edges; between two, the first class with an open window
	// holds the time (of that class, the window opened first).
	type edge struct {
		at   float64
		open bool
		w    int
	}
	var edges []edge
	for i, w := range raw {
		a, b := clamp(w.from, 0, end), clamp(w.to, 0, end)
		if b > a {
			edges = append(edges, edge{a, true, i}, edge{b, false, i})
		}
	}
	sort.Slice(edges, func(a, b int) bool { return edges[a].at < edges[b].at })
	var open [nClass][]int
	var out []window
	for i, e := range edges {
		cl := raw[e.w].class
		if e.open {
			open[cl] = append(open[cl], e.w)
		} else {
			open[cl] = slices.DeleteFunc(open[cl], func(x int) bool { return x == e.w })
		}
		if i+1 == len(edges) || edges[i+1].at <= e.at {
			continue
		}
		a, b := e.at, edges[i+1].at
		for c := range nClass {
			if len(open[c]) == 0 {
				continue
			}
			w := window{a, b, c, raw[open[c][0]].round}
			if n := len(out); n > 0 && out[n-1].to == a && out[n-1].class == w.class && out[n-1].round == w.round {
				out[n-1].to = b
			} else {
				out = append(out, w)
			}
			break
		}
	}
	return out
}

// classIn is the time of class in the windows of round (−1: of no round;
// −2: of any).
func classIn(wins []window, round, class int) float64 {
	var t float64
	for _, w := range wins {
		if w.class == class && (round == -2 || w.round == round) {
			t += w.to - w.from
		}
	}
	return t
}

func overlap(a, b, c, d float64) float64 { return max(0, min(b, d)-max(a, c)) }

func clamp(x, lo, hi float64) float64 { return min(max(x, lo), hi) }

// unionLen is the length of the union of ws.
func unionLen(ws []window) float64 {
	sort.Slice(ws, func(a, b int) bool { return ws[a].from < ws[b].from })
	var total, end float64
	end = math.Inf(-1)
	for _, w := range ws {
		if w.from > end {
			total += w.to - w.from
			end = w.to
		} else if w.to > end {
			total += w.to - end
			end = w.to
		}
	}
	return total
}

// median is the middle of xs (the mean of the two middle ones), 0 for
// none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	sort.Float64s(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}
