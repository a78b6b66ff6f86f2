package model_test

import (
	"math"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/model"
)

// intervalCases are (C, M) pairs from C ≪ M, where Young's formula is
// good, to C not small against M, where it is not and Daly's is, to
// C ≥ 2M, where Daly's optimum is τ = M.
var intervalCases = []struct {
	name string
	c, m time.Duration
	// youngOff: Young's period is more than 10% from the optimum.
	youngOff bool
	// trials of the simulation: enough for its noise to stay well below
	// how little the run time changes near the optimum.
	trials int
}{
	{"10s/24h", 10 * time.Second, 24 * time.Hour, false, 4000},
	{"1m/6h", time.Minute, 6 * time.Hour, false, 4000},
	{"5m/1h", 5 * time.Minute, time.Hour, true, 4000},
	{"30m/1h", 30 * time.Minute, time.Hour, true, 2000},
	{"1h/1h", time.Hour, time.Hour, true, 1000},
	{"3h/1h", 3 * time.Hour, time.Hour, true, 200},
}

// bruteForce returns the τ among n log-spaced values in [lo, hi] that
// minimizes cost, refined by a parabola through the best grid point and
// its k neighbours either side (in log τ).
func bruteForce(lo, hi time.Duration, n, k int, cost func(tau time.Duration) float64) time.Duration {
	taus := make([]float64, n)
	costs := make([]float64, n)
	best := 0
	for i := range n {
		taus[i] = math.Log(lo.Seconds()) + (math.Log(hi.Seconds())-math.Log(lo.Seconds()))*float64(i)/float64(n-1)
		costs[i] = cost(time.Duration(math.Exp(taus[i]) * float64(time.Second)))
		if costs[i] < costs[best] {
			best = i
		}
	}
	if best == 0 || best == n-1 {
		return time.Duration(math.Exp(taus[best]) * float64(time.Second))
	}
	// Least-squares parabola through the k points either side of the
	// best one.
	var sx, sx2, sx3, sx4, sy, sxy, sx2y, cnt float64
	for i := max(0, best-k); i <= min(n-1, best+k); i++ {
		x, y := taus[i]-taus[best], costs[i]
		sx += x
		sx2 += x * x
		sx3 += x * x * x
		sx4 += x * x * x * x
		sy += y
		sxy += x * y
		sx2y += x * x * y
		cnt++
	}
	// Solve [sx4 sx3 sx2; sx3 sx2 sx; sx2 sx cnt]·[a b c] = [sx2y sxy sy].
	a, b, _ := solve3([3][3]float64{{sx4, sx3, sx2}, {sx3, sx2, sx}, {sx2, sx, cnt}}, [3]float64{sx2y, sxy, sy})
	x := taus[best]
	if a > 0 {
		x += -b / (2 * a)
	}
	return time.Duration(math.Exp(x) * float64(time.Second))
}

func solve3(m [3][3]float64, v [3]float64) (float64, float64, float64) {
	det := func(m [3][3]float64) float64 {
		return m[0][0]*(m[1][1]*m[2][2]-m[1][2]*m[2][1]) - m[0][1]*(m[1][0]*m[2][2]-m[1][2]*m[2][0]) + m[0][2]*(m[1][0]*m[2][1]-m[1][1]*m[2][0])
	}
	d := det(m)
	var out [3]float64
	for col := range 3 {
		mc := m
		for row := range 3 {
			mc[row][col] = v[row]
		}
		out[col] = det(mc) / d
	}
	return out[0], out[1], out[2]
}

func within(got, want time.Duration, rel float64) bool {
	return math.Abs(got.Seconds()-want.Seconds()) <= rel*want.Seconds()
}

// TestIntervalExpected: the interval cairn chooses is, within 10%, the
// one a brute-force search over intervals finds for the exact expected
// run time (expected lost work plus overhead), for every (C, M); Young's
// is too, but only while C is small against M.
func TestIntervalExpected(t *testing.T) {
	for _, tc := range intervalCases {
		t.Run(tc.name, func(t *testing.T) {
			ch := model.Choose(tc.c, tc.m)
			s := model.Scenario{Work: 100 * tc.m, C: tc.c, R: tc.c, M: tc.m}
			cost := func(tau time.Duration) float64 {
				s.Tau = tau
				return model.Expected(s)
			}
			tau := bruteForce(tc.m/100000, 10*tc.m, 2001, 2, cost)
			best := tau + tc.c
			t.Logf("C %s M %s: chosen every %s (τ %s), brute force %s (τ %s), Young %s; expected time %+.3f%% over the best",
				tc.c, tc.m, ch.Every.Round(time.Second), ch.Tau.Round(time.Second), best.Round(time.Second), tau.Round(time.Second),
				ch.Young.Round(time.Second), 100*(cost(ch.Tau)/cost(tau)-1))
			if !within(ch.Every, best, 0.10) {
				t.Errorf("chosen interval %s, brute-force optimum %s: more than 10%% apart", ch.Every, best)
			}
			if !within(model.Optimum(tc.c, tc.m), tau, 0.01) {
				t.Errorf("Optimum %s, brute force τ %s", model.Optimum(tc.c, tc.m), tau)
			}
			if off := !within(ch.Young, best, 0.10); off != tc.youngOff {
				t.Errorf("Young's interval %s vs optimum %s: off by more than 10%% is %v, want %v", ch.Young, best, off, tc.youngOff)
			}
		})
	}
}

// TestIntervalSimulated: the same against a simulation of runs with
// random failures, the failures the same for every interval tried.
func TestIntervalSimulated(t *testing.T) {
	for _, tc := range intervalCases {
		t.Run(tc.name, func(t *testing.T) {
			ch := model.Choose(tc.c, tc.m)
			s := model.Scenario{Work: 20 * tc.m, C: tc.c, R: tc.c, M: tc.m}
			cost := func(tau time.Duration) float64 {
				s.Tau = tau
				return model.Simulate(s, tc.trials, 1)
			}
			y := model.Young(tc.c, tc.m)
			tau := bruteForce(y/8, 2*y, 41, 6, cost)
			best := tau + tc.c
			t.Logf("C %s M %s: chosen every %s, simulated optimum %s; simulated time at the chosen one %+.3f%% over it",
				tc.c, tc.m, ch.Every.Round(time.Second), best.Round(time.Second), 100*(cost(ch.Tau)/cost(tau)-1))
			if !within(ch.Every, best, 0.10) {
				t.Errorf("chosen interval %s, simulated optimum %s: more than 10%% apart", ch.Every, best)
			}
		})
	}
}

func TestDalyBranches(t *testing.T) {
	for _, tc := range []struct {
		c, m, want time.Duration
	}{
		{time.Hour, time.Hour, time.Duration(math.Sqrt(2)*(1+math.Sqrt(0.5)/3+0.5/9)*float64(time.Hour)) - time.Hour},
		{2 * time.Hour, time.Hour, time.Hour},
		{0, time.Hour, 0},
	} {
		if got := model.Daly(tc.c, tc.m); !within(got, tc.want, 1e-9) {
			t.Errorf("Daly(%s, %s) = %s, want %s", tc.c, tc.m, got, tc.want)
		}
	}
	if got := model.Choose(time.Millisecond, time.Second); got.Every != model.MinInterval || got.Formula != "minimum" {
		t.Errorf("a tiny interval: %+v, want the minimum", got)
	}
	if got := model.Choose(0, time.Hour); got.Cost != model.DefaultCost {
		t.Errorf("no cost measured: %+v, want the default cost", got)
	}
}
