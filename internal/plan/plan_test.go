package plan_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cairn-hpc/cairn/internal/plan"
)

// subsets calls fn with every f-subset of n nodes as a failed mask.
func subsets(n, f int, fn func(failed []bool)) {
	failed := make([]bool, n)
	var rec func(start, left int)
	rec = func(start, left int) {
		if left == 0 {
			fn(failed)
			return
		}
		for i := start; i <= n-left; i++ {
			failed[i] = true
			rec(i+1, left-1)
			failed[i] = false
		}
	}
	rec(0, f)
}

// bruteFixed enumerates every failure set for a fixed placement.
func bruteFixed(holders [][]int, n, f int) float64 {
	ok, all := 0, 0
	subsets(n, f, func(failed []bool) {
		all++
		if plan.Survives(holders, failed) {
			ok++
		}
	})
	return float64(ok) / float64(all)
}

// bruteRandom enumerates every random placement (each node's holder set)
// and every failure set.
func bruteRandom(n, k, f int) float64 {
	// All k-subsets of the other nodes, for each node.
	choices := make([][][]int, n)
	for i := 0; i < n; i++ {
		others := []int{}
		for j := 0; j < n; j++ {
			if j != i {
				others = append(others, j)
			}
		}
		subsets(n-1, k, func(m []bool) {
			var s []int
			for x, in := range m {
				if in {
					s = append(s, others[x])
				}
			}
			choices[i] = append(choices[i], s)
		})
	}
	holders := make([][]int, n)
	var sum float64
	count := 0
	var rec func(i int)
	rec = func(i int) {
		if i == n {
			sum += bruteFixed(holders, n, f)
			count++
			return
		}
		for _, c := range choices[i] {
			holders[i] = c
			rec(i + 1)
		}
	}
	rec(0)
	return sum / float64(count)
}

// TestExactAgainstEnumeration compares Exact with a count over every
// failure set (and every random placement) for small clusters.
func TestExactAgainstEnumeration(t *testing.T) {
	for n := 1; n <= 9; n++ {
		for k := 0; k <= min(3, n-1); k++ {
			for f := 0; f <= n; f++ {
				for _, p := range []plan.Placement{plan.Ring, plan.Pairs} {
					want := bruteFixed(plan.Holders(n, k, p, nil), n, f)
					got, err := plan.Exact(n, k, f, p)
					if err != nil || math.Abs(got-want) > 1e-12 {
						t.Errorf("Exact(n=%d k=%d f=%d %v) = %v, %v; enumeration says %v", n, k, f, p, got, err, want)
					}
				}
				if n <= 5 {
					want := bruteRandom(n, k, f)
					got, _ := plan.Exact(n, k, f, plan.Random)
					if math.Abs(got-want) > 1e-12 {
						t.Errorf("Exact(n=%d k=%d f=%d random) = %v; enumeration says %v", n, k, f, got, want)
					}
				}
			}
		}
	}
}

// TestExactAgainstMonteCarlo: for a grid of larger clusters, the exact
// value lies in the 99.9% interval of the simulation (seeded).
func TestExactAgainstMonteCarlo(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	misses := 0
	cases := 0
	for _, n := range []int{16, 64, 257, 1024} {
		for _, k := range []int{1, 2, 3} {
			for _, p := range []plan.Placement{plan.Random, plan.Ring, plan.Pairs} {
				for _, f := range []int{2, n / 16, n / 4} {
					if f < 1 {
						continue
					}
					exact, err := plan.Exact(n, k, f, p)
					if err != nil {
						t.Fatal(err)
					}
					est, err := plan.MonteCarlo(n, k, f, p, 2000, 3.29, rng)
					if err != nil {
						t.Fatal(err)
					}
					cases++
					if exact < est.Low-1e-9 || exact > est.High+1e-9 {
						misses++
						t.Logf("n=%d k=%d f=%d %v: exact %.4f outside MC [%.4f, %.4f]", n, k, f, p, exact, est.Low, est.High)
					}
				}
			}
		}
	}
	// At 99.9% a miss or two in ~100 intervals could happen by chance
	// (this seed has none); more means a bug.
	if misses > 1 {
		t.Errorf("%d of %d exact values outside the Monte Carlo interval", misses, cases)
	}
}

func TestKnownValues(t *testing.T) {
	// 16 nodes, k=1, 2 failures: ring fails iff they are neighbours
	// (16 of 120 pairs), pairs iff they form a pair (8 of 120), random iff
	// either failed node's one holder is the other.
	for _, tc := range []struct {
		p    plan.Placement
		want float64
	}{
		{plan.Ring, 1 - 16.0/120},
		{plan.Pairs, 1 - 8.0/120},
		{plan.Random, (1 - 1.0/15) * (1 - 1.0/15)},
	} {
		got, _ := plan.Exact(16, 1, 2, tc.p)
		if math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%v: %v, want %v", tc.p, got, tc.want)
		}
	}
}

func TestToleranceAndReplicas(t *testing.T) {
	// Monotone: more replicas tolerate at least as many failures.
	for _, p := range []plan.Placement{plan.Random, plan.Ring, plan.Pairs} {
		prev := -1
		for k := 0; k <= 3; k++ {
			f, err := plan.Tolerable(4096, k, p, 0.99)
			if err != nil {
				t.Fatal(err)
			}
			if f < prev {
				t.Errorf("%v: k=%d tolerates %d < %d at k=%d", p, k, f, prev, k-1)
			}
			// The answer is tight: f meets the target and f+1 does not.
			pf, _ := plan.Exact(4096, k, f, p)
			pn, _ := plan.Exact(4096, k, f+1, p)
			if pf < 0.99 || pn >= 0.99 {
				t.Errorf("%v k=%d: P(%d)=%v P(%d)=%v around 0.99", p, k, f, pf, f+1, pn)
			}
			prev = f
		}
	}
	k, ok, err := plan.ReplicasFor(4096, 64, plan.Random, 0.999)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	pk, _ := plan.Exact(4096, k, 64, plan.Random)
	pk1, _ := plan.Exact(4096, k-1, 64, plan.Random)
	if pk < 0.999 || pk1 >= 0.999 {
		t.Errorf("ReplicasFor = %d: P=%v, P(k-1)=%v", k, pk, pk1)
	}
	if _, err := plan.Exact(4, 4, 1, plan.Ring); err == nil {
		t.Error("k = n accepted")
	}
}
