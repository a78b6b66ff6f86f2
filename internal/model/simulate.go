package model

import (
	"math"
	"math/rand/v2"
	"time"
)

// Scenario is a job for the interval's simulation: Work of computation,
// a checkpoint of cost C after every Tau of it, failures at the times of
// a Poisson process of mean M (exponential times between them), each
// losing the work and checkpoint in progress and costing a restart of R,
// during which another failure may come.
type Scenario struct {
	Work, Tau, C, R, M time.Duration
}

// Expected returns the scenario's expected run time in seconds, exactly,
// for a job long against Tau (the last segment counts by its share of
// Tau). A segment of Tau of work and its checkpoint, L = τ + C, started
// afresh completes after an expected e^(R/M)·M·(e^(L/M) − 1): an attempt
// fails before its end with probability 1 − e^(−L/M), and every failure
// costs the time until it and a restart that must itself see no failure.
// The job takes Work/τ segments. This is what Daly's interval minimizes,
// and Optimum minimizes exactly.
func Expected(s Scenario) float64 {
	if s.Tau <= 0 || s.M <= 0 {
		return math.Inf(1)
	}
	m := s.M.Seconds()
	seg := math.Exp(s.R.Seconds()/m) * m * math.Expm1((s.Tau.Seconds()+s.C.Seconds())/m)
	return s.Work.Seconds() / s.Tau.Seconds() * seg
}

// Simulate runs the scenario trials times and returns the mean run time
// in seconds. Each run does whole segments until Work is done, and its
// time is scaled by Work over the work it did, so that no interval pays
// for a last segment longer than needed. Trial i draws its failures from
// a generator seeded by (seed, i), on the wall clock: every Tau meets
// the same failures, so that intervals compare on the same luck.
func Simulate(s Scenario, trials int, seed uint64) float64 {
	var sum float64
	for i := range trials {
		sum += simulateOnce(s, rand.New(rand.NewPCG(seed, uint64(i))))
	}
	return sum / float64(trials)
}

// simulateOnce is one run: the clock goes from segment to segment and
// from failure to failure.
func simulateOnce(s Scenario, rng *rand.Rand) float64 {
	tau, c, r, m := s.Tau.Seconds(), s.C.Seconds(), s.R.Seconds(), s.M.Seconds()
	segs := math.Ceil(s.Work.Seconds() / tau)
	now := 0.0
	fail := rng.ExpFloat64() * m // the next failure
	for done := 0.0; done < segs; {
		if now+tau+c <= fail {
			now += tau + c
			done++
			continue
		}
		// The segment is lost; restart until a restart completes.
		now = fail
		fail = now + rng.ExpFloat64()*m
		for now+r > fail {
			now = fail
			fail = now + rng.ExpFloat64()*m
		}
		now += r
	}
	return now * s.Work.Seconds() / (segs * tau)
}
