package model_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/model"
)

var t0 = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func dur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// job is a synthetic job: rounds at the given starts, each frozen for
// stall, storing for store after the thaw, then copying for copyT; it
// progresses at rate, at rate·after while storing and rate·copy while
// copying, and reports every step seconds. With noise, each interval's
// rate is off by a normal noise (relative), and each report's time by a
// normal jitter (seconds), drawn from seed.
type job struct {
	rate, after, copy   float64
	starts              []float64
	stall, store, copyT float64
	coord, cont         float64
	step, end           float64
	noise, jitter       float64
	seed                uint64
}

func (j job) input() model.Input {
	in := model.Input{From: t0, To: at(j.end)}
	for i, s := range j.starts {
		r := model.Round{Seq: i + 1, State: coordv1.CkptProtected, Start: at(s), Stall: dur(j.stall), Coord: dur(j.coord), Cont: dur(j.cont),
			Durable: at(s + j.stall + j.store)}
		if j.copyT > 0 {
			r.Copies = []coordv1.CopySpan{{From: at(s + j.stall + j.store), To: at(s + j.stall + j.store + j.copyT), Copies: 1, Bytes: 1 << 20}}
		}
		in.Rounds = append(in.Rounds, r)
	}
	// rateAt is the job's rate at time t.
	rateAt := func(t float64) float64 {
		for _, s := range j.starts {
			switch {
			case t >= s && t < s+j.stall:
				return 0
			case t >= s+j.stall && t < s+j.stall+j.store:
				return j.rate * j.after
			case t >= s+j.stall+j.store && t < s+j.stall+j.store+j.copyT:
				return j.rate * j.copy
			}
		}
		return j.rate
	}
	rng := rand.New(rand.NewPCG(j.seed, 2))
	count := 0.0
	const dt = 0.001
	for t := 0.0; t <= j.end+1e-9; t += j.step {
		in.Samples = append(in.Samples, model.Sample{At: at(t + j.jitter*rng.NormFloat64()), Count: count})
		f := 1 + j.noise*rng.NormFloat64()
		for x := t; x < t+j.step-1e-9; x += dt {
			count += rateAt(x+dt/2) * dt * f
		}
	}
	return in
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// TestMeasureExact: with rates that are constant within each kind of
// time and no noise, the model finds them, and the terms add up to the
// run time exactly.
func TestMeasureExact(t *testing.T) {
	j := job{rate: 1000, after: 0.5, copy: 0.8, starts: []float64{10.3, 30.6, 50.2}, stall: 0.4, store: 0.7, copyT: 1.6,
		coord: 0.01, cont: 0.09, step: 1, end: 70}
	ov, terms := model.Measure(j.input())
	if !ov.Checked || ov.Progress == nil {
		t.Fatalf("not measured: %+v", ov)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"run", ov.Run, 70},
		{"rate", ov.Progress.Rate, 1000},
		{"rate after", ov.Progress.RateAfter, 500},
		{"rate copying", ov.Progress.RateCopy, 800},
		{"alpha", ov.Alpha, 1.25},
		{"t_comm", ov.TComm, 3 * 1.6 * 0.8},
		{"t_after", ov.TAfter, 3 * 0.7 * 0.5},
		{"t_coord", ov.TCoord, 0.01},
		{"t_cont", ov.TCont, 0.09},
		{"t_write", ov.TWrite, 0.3},
		{"t_total", ov.Total, 70},
		{"residual", ov.Residual, 0},
		// The work outside copies at the undisturbed rate: the quiet time
		// and half the store time.
		{"t_comp", ov.TComp, 70 - 3*(0.4+0.7+1.6) + 3*0.7*0.5},
	} {
		if !near(c.got, c.want, 1e-3*math.Max(1, math.Abs(c.want))) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if ov.N != 3 || !ov.Within {
		t.Errorf("n %d, within %v", ov.N, ov.Within)
	}
	for _, c := range terms {
		if !near(c.TCoord+c.TWrite+c.TCont, c.Stall, 1e-9) {
			t.Errorf("ckpt %d: t_coord + t_write + t_cont = %v, stall %v", c.Seq, c.TCoord+c.TWrite+c.TCont, c.Stall)
		}
		if !near(c.Cost, 0.4+0.35+1.6*0.2, 1e-3) {
			t.Errorf("ckpt %d: cost %v", c.Seq, c.Cost)
		}
	}
	// The model: t_total = t_comp + α·t_comm + n·(t_coord + t_write + t_cont) + t_after.
	sum := ov.TComp + ov.Alpha*ov.TComm + float64(ov.N)*(ov.TCoord+ov.TWrite+ov.TCont) + ov.TAfter + ov.TOther
	if !near(sum, ov.Total, 1e-9) {
		t.Errorf("terms sum to %v, t_total %v", sum, ov.Total)
	}
}

// TestResidualSeesAWrongStall: the job of TestMeasureExact, whose rounds
// freeze it for 0.4 s, reported with stalls of half and twice that: the
// residual is outside the tolerance, of the sign that says which way the
// stall is wrong (too short: the run is longer than its terms).
//
// Only a part of the error shows in the residual: the time a stall too
// short leaves out is taken as slow progress after the thaw, which the
// fit of the rate after a thaw absorbs for the most part. With no noise
// the tolerance is n·ClockNoise and that part exceeds it; with the noise
// of a real job's progress (TestMeasureNoise) the tolerance is larger
// than such an error, and the stalls are checked against the events
// instead (test/ops TestReport).
func TestResidualSeesAWrongStall(t *testing.T) {
	j := job{rate: 1000, after: 0.5, copy: 0.8, starts: []float64{10.3, 30.6, 50.2}, stall: 0.4, store: 0.7, copyT: 1.6,
		coord: 0.01, cont: 0.09, step: 1, end: 70}
	for _, tc := range []struct {
		name   string
		factor float64
		sign   float64 // of the residual; 0: within the tolerance
	}{
		{"as measured", 1, 0},
		{"half", 0.5, +1},
		{"twice", 2, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := j.input()
			for i := range in.Rounds {
				in.Rounds[i].Stall = dur(j.stall * tc.factor)
			}
			ov, _ := model.Measure(in)
			if !ov.Checked {
				t.Fatalf("not measured: %+v", ov)
			}
			missing := float64(len(in.Rounds)) * j.stall * (1 - tc.factor)
			t.Logf("stalls off by %+.2f s in all: residual %+.3f s, tolerance %.3f s", missing, ov.Residual, ov.Tolerance)
			switch {
			case tc.sign == 0 && !ov.Within:
				t.Errorf("residual %+.3f s beyond the tolerance %.3f s with the stalls as measured", ov.Residual, ov.Tolerance)
			case tc.sign != 0 && (ov.Within || ov.Residual*tc.sign <= ov.Tolerance):
				t.Errorf("stalls off by %+.2f s: residual %+.3f s, tolerance %.3f s (within: %v); want it beyond, of sign %+.0f",
					missing, ov.Residual, ov.Tolerance, ov.Within, tc.sign)
			}
		})
	}
}

// TestMeasureNoise: with each interval's rate off by 15% (normal) and
// reports late or early by 20 ms, the residual stays within the tolerance
// the model states, and α within three of its standard errors.
func TestMeasureNoise(t *testing.T) {
	j := job{rate: 1000, after: 0.4, copy: 0.7, starts: []float64{10.3, 40.6, 70.2, 100.5}, stall: 0.4, store: 0.7, copyT: 3.5,
		coord: 0.01, cont: 0.09, step: 1, end: 130, noise: 0.15, jitter: 0.02, seed: 1}
	ov, _ := model.Measure(j.input())
	t.Logf("residual %.3f s, tolerance %.3f s, α %.3f ± %.3f, noise %.3f", ov.Residual, ov.Tolerance, ov.Alpha, ov.Progress.AlphaErr, ov.Progress.Noise)
	if !ov.Within {
		t.Errorf("residual %v beyond the tolerance %v", ov.Residual, ov.Tolerance)
	}
	if want := 1 / 0.7; math.Abs(ov.Alpha-want) > 3*ov.Progress.AlphaErr {
		t.Errorf("α %v ± %v, want %v", ov.Alpha, ov.Progress.AlphaErr, want)
	}
}

// TestMeasureBriefCopies: copies too brief to tell from the store before
// them (one replica of small images) are not given an α of their own:
// their effect counts in t_after, and the terms still add up.
func TestMeasureBriefCopies(t *testing.T) {
	j := job{rate: 1000, after: 0.5, copy: 0.2, starts: []float64{10.3, 30.6, 50.2}, stall: 0.2, store: 0.45, copyT: 0.15,
		coord: 0.01, cont: 0.09, step: 0.5, end: 70, noise: 0.15, jitter: 0.01, seed: 3}
	ov, terms := model.Measure(j.input())
	if ov.Alpha != 1 || !strings.Contains(ov.AlphaBasis, "not measured") || ov.Progress.RateCopy != ov.Progress.RateAfter || !ov.Within {
		t.Errorf("α %v (%s), rates %+v, residual %v of %v", ov.Alpha, ov.AlphaBasis, ov.Progress, ov.Residual, ov.Tolerance)
	}
	// The store's and the copies' loss: 0.45·0.5 + 0.15·0.8 a round,
	// within three standard errors (15% noise on 0.5 s intervals).
	if want := 3 * (0.225 + 0.12); !near(ov.TAfter, want, 0.25) || terms[0].TCopy != 0 {
		t.Errorf("t_after %v, want about %v; t_copy %v", ov.TAfter, want, terms[0].TCopy)
	}
}

// TestToleranceCalibrated: the tolerance is three standard deviations of
// the residual: over 300 runs with each interval's rate off by 25%
// (normal) and reports off by 20 ms, the residual's root mean square is
// about a third of it, and hardly any run is beyond it.
func TestToleranceCalibrated(t *testing.T) {
	var sum2 float64
	outside := 0
	const runs = 300
	for seed := range uint64(runs) {
		j := job{rate: 1000, after: 0.4, copy: 0.7, starts: []float64{10.3, 40.6, 70.2}, stall: 0.4, store: 0.7, copyT: 0.5,
			coord: 0.01, cont: 0.09, step: 1, end: 100, noise: 0.25, jitter: 0.02, seed: seed}
		ov, _ := model.Measure(j.input())
		r := ov.Residual / ov.Tolerance
		sum2 += r * r
		if !ov.Within {
			outside++
		}
	}
	rms := math.Sqrt(sum2 / runs)
	t.Logf("rms residual/tolerance %.2f; %d of %d runs beyond it", rms, outside, runs)
	if rms < 0.25 || rms > 0.45 || outside > runs/50 {
		t.Errorf("rms residual/tolerance %.2f, %d of %d runs beyond it: want about 1/3 and at most 2%%", rms, outside, runs)
	}
}

// TestMeasureNoProgress: without progress reports, t_comp is the run
// minus the stalls and nothing is checked.
func TestMeasureNoProgress(t *testing.T) {
	j := job{rate: 1, starts: []float64{10, 20}, stall: 0.5, store: 0.2, coord: 0.02, cont: 0.1, step: 1, end: 30}
	in := j.input()
	in.Samples = nil
	in.Stalls = []model.Span{{From: at(25), To: at(25.3)}}
	ov, terms := model.Measure(in)
	if ov.Checked || ov.Residual != 0 || !near(ov.TComp, 30-1-0.3, 1e-9) || ov.Alpha != 1 || !near(ov.TOther, 0.3, 1e-9) {
		t.Errorf("%+v", ov)
	}
	if len(terms) != 2 || !near(terms[0].TWrite, 0.38, 1e-9) || !near(terms[0].Ingest, 0.2, 1e-9) {
		t.Errorf("%+v", terms)
	}
}

// TestMeasureSpan: the span is that of the reports after the last
// restart (the count went back), and a round cut by its edge counts by
// the part inside.
func TestMeasureSpan(t *testing.T) {
	j := job{rate: 100, after: 1, copy: 1, starts: []float64{20.5}, stall: 1, store: 0.1, coord: 0.1, cont: 0.1, step: 1, end: 40}
	in := j.input()
	old := []model.Sample{{At: at(-20), Count: 500}, {At: at(-19), Count: 600}}
	in.Samples = append(old, in.Samples...)
	// A stall half before the first report.
	in.Rounds = append(in.Rounds, model.Round{Seq: 9, Start: at(-0.5), Stall: dur(1), Coord: dur(0.1), Cont: dur(0.1)})
	ov, _ := model.Measure(in)
	if !ov.From.Equal(at(0)) || ov.N != 2 || !near(ov.TWrite, (0.8+0.4)/2, 1e-9) {
		t.Errorf("from %v, n %d, t_write %v", ov.From, ov.N, ov.TWrite)
	}
}

func TestCost(t *testing.T) {
	terms := []coordv1.CkptTerms{
		{State: coordv1.CkptDurable, Cost: 9},
		{State: coordv1.CkptProtected, Cost: 1},
		{State: coordv1.CkptAborted, Cost: 100},
		{State: coordv1.CkptDurable, Cost: 3},
		{State: coordv1.CkptDurable, Cost: 2},
	}
	if c, _ := model.Cost(terms, false); c != 2500*time.Millisecond {
		t.Errorf("cost %v, want the median of 9, 1, 3, 2", c)
	}
	if c, basis := model.Cost(nil, false); c != model.DefaultCost || basis == "" {
		t.Errorf("no rounds: %v %q", c, basis)
	}
}

func TestMTBF(t *testing.T) {
	few := model.Failures{Exposure: 40 * time.Hour, Count: 4}
	many := model.Failures{Exposure: 100 * time.Hour, Count: 5}
	for _, tc := range []struct {
		name       string
		job, coord time.Duration
		f          model.Failures
		node       time.Duration
		source     string
	}{
		{"the job's first", time.Hour, 2 * time.Hour, many, time.Hour, "job"},
		{"a trusted estimate next", 0, 2 * time.Hour, many, 20 * time.Hour, "estimate"},
		{"the coordinator's while too few failures", 0, 2 * time.Hour, few, 2 * time.Hour, "coordinator"},
		{"none", 0, 0, few, 0, ""},
	} {
		m := model.MTBF(tc.job, tc.coord, tc.f, 4)
		if m.Node != tc.node || m.Source != tc.source || m.Job != tc.node/4 {
			t.Errorf("%s: %+v", tc.name, m)
		}
	}
}
