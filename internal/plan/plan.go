package plan

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
)

// Placement says where a node's k replicas go.
type Placement int

const (
	Random Placement = iota
	Ring
	Pairs
)

func (p Placement) String() string {
	switch p {
	case Random:
		return "random"
	case Ring:
		return "ring"
	case Pairs:
		return "pairs"
	}
	return fmt.Sprintf("placement(%d)", int(p))
}

// ParsePlacement reads "random", "ring" or "pairs".
func ParsePlacement(s string) (Placement, error) {
	for _, p := range []Placement{Random, Ring, Pairs} {
		if strings.EqualFold(s, p.String()) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown placement %q: want random, ring or pairs", s)
}

// ErrInput is returned for parameters that describe no cluster.
var ErrInput = errors.New("invalid planning parameters")

func check(n, k, f int) error {
	switch {
	case n < 1:
		return fmt.Errorf("%w: %d nodes", ErrInput, n)
	case k < 0 || k > n-1:
		return fmt.Errorf("%w: %d replicas with %d nodes (at most %d)", ErrInput, k, n, n-1)
	case f < 0 || f > n:
		return fmt.Errorf("%w: %d failures with %d nodes", ErrInput, f, n)
	}
	return nil
}

// Exact returns the probability that a job on n nodes with k replicas per
// node can restart after f random simultaneous node failures.
func Exact(n, k, f int, p Placement) (float64, error) {
	if err := check(n, k, f); err != nil {
		return 0, err
	}
	if f == 0 {
		return 1, nil
	}
	if f == n {
		return 0, nil
	}
	switch p {
	case Random:
		if k == 0 {
			return 0, nil // f >= 1 and no replica
		}
		// A failed node loses its images iff all k holders are among the
		// other f-1 failed nodes; holder sets are independent.
		q := math.Exp(lchoose(f-1, k) - lchoose(n-1, k))
		return math.Pow(1-q, float64(f)), nil
	case Ring:
		return ringSurvive(n, k, f), nil
	case Pairs:
		return pairsSurvive(n, k, f), nil
	}
	return 0, fmt.Errorf("%w: placement %v", ErrInput, p)
}

// lchoose is log C(a, b); -Inf if b > a.
func lchoose(a, b int) float64 {
	if b < 0 || b > a {
		return math.Inf(-1)
	}
	la, _ := math.Lgamma(float64(a + 1))
	lb, _ := math.Lgamma(float64(b + 1))
	lc, _ := math.Lgamma(float64(a - b + 1))
	return la - lb - lc
}

// ringSurvive is the probability that a uniformly random f-subset of the
// n-cycle holds no run of k+1 consecutive nodes (node i's images die iff
// i..i+k all fail).
func ringSurvive(n, k, f int) float64 {
	if f == n {
		return 0
	}
	// State: remaining failures r, whether the run that began at node 0 is
	// still open, its length (prefix) and the current run's length.
	type st struct{ open, prefix, cur int }
	idx := func(s st) int { return (s.open*(k+1)+s.prefix)*(k+1) + s.cur }
	size := 2 * (k + 1) * (k + 1)
	cur := make([][]float64, f+1)
	next := make([][]float64, f+1)
	for r := range cur {
		cur[r] = make([]float64, size)
		next[r] = make([]float64, size)
	}
	cur[f][idx(st{1, 0, 0})] = 1
	for j := 0; j < n; j++ {
		m := n - j // nodes left, this one included
		for r := range next {
			clear(next[r])
		}
		for r := 0; r <= f; r++ {
			for open := 0; open < 2; open++ {
				for prefix := 0; prefix <= k; prefix++ {
					for c := 0; c <= k; c++ {
						pr := cur[r][idx(st{open, prefix, c})]
						if pr == 0 {
							continue
						}
						pFail := float64(r) / float64(m)
						if r > 0 && c+1 <= k { // fails, run stays short
							ns := st{open, prefix, c + 1}
							if open == 1 {
								ns.prefix = c + 1
							}
							next[r-1][idx(ns)] += pr * pFail
						}
						if m > r { // survives
							next[r][idx(st{0, prefix, 0})] += pr * (1 - pFail)
						}
					}
				}
			}
		}
		cur, next = next, cur
	}
	var total float64
	for prefix := 0; prefix <= k; prefix++ {
		for c := 0; c <= k; c++ {
			if prefix+c <= k { // the run across the wrap is short too
				total += cur[0][idx(st{0, prefix, c})]
			}
		}
	}
	return total
}

// groups returns the group sizes of the pairs placement.
func groups(n, k int) []int {
	g := k + 1
	m := n / g
	if m == 0 {
		return []int{n}
	}
	sizes := make([]int, m)
	for i := range sizes {
		sizes[i] = g
	}
	sizes[m-1] += n % g
	return sizes
}

// pairsSurvive: groups survive independently given how many failures fall
// in each; a group of size s loses images iff a cyclic run of k+1 of its
// nodes failed (for s = k+1: all of them).
func pairsSurvive(n, k, f int) float64 {
	sizes := groups(n, k)
	// groupOK[s][j]: probability that j random failures among a group of s
	// leave every image alive.
	groupOK := map[int][]float64{}
	for _, s := range sizes {
		if _, ok := groupOK[s]; ok {
			continue
		}
		v := make([]float64, s+1)
		for j := 0; j <= s; j++ {
			v[j] = ringSurvive(s, k, j)
		}
		groupOK[s] = v
	}
	// dist[r]: probability of having r failures left to place and every
	// group so far alive.
	dist := make([]float64, f+1)
	dist[f] = 1
	left := n
	for _, s := range sizes {
		next := make([]float64, f+1)
		for r, pr := range dist {
			if pr == 0 {
				continue
			}
			for j := 0; j <= min(s, r); j++ {
				// hypergeometric: j of the r failures among the s nodes
				lp := lchoose(s, j) + lchoose(left-s, r-j) - lchoose(left, r)
				if math.IsInf(lp, -1) {
					continue
				}
				next[r-j] += pr * math.Exp(lp) * groupOK[s][j]
			}
		}
		dist = next
		left -= s
	}
	return dist[0]
}

// Holders returns, for every node, the nodes that hold its replicas under
// placement p (for Random, drawn with rng).
func Holders(n, k int, p Placement, rng *rand.Rand) [][]int {
	h := make([][]int, n)
	switch p {
	case Random:
		for i := range h {
			// k distinct others: rejection sampling, since k is small next
			// to n (for k close to n, a permutation).
			if 2*k > n-1 {
				for _, x := range rng.Perm(n - 1)[:k] {
					if x >= i {
						x++ // skip the node itself
					}
					h[i] = append(h[i], x)
				}
				continue
			}
			for len(h[i]) < k {
				x := rng.IntN(n)
				if x == i || slices.Contains(h[i], x) {
					continue
				}
				h[i] = append(h[i], x)
			}
		}
	case Ring:
		for i := range h {
			for d := 1; d <= k; d++ {
				h[i] = append(h[i], (i+d)%n)
			}
		}
	case Pairs:
		start := 0
		for _, s := range groups(n, k) {
			for i := 0; i < s; i++ {
				for d := 1; d <= k; d++ {
					h[start+i] = append(h[start+i], start+(i+d)%s)
				}
			}
			start += s
		}
	}
	return h
}

// Survives reports whether every node's images survive the failed set.
func Survives(holders [][]int, failed []bool) bool {
	for i, hs := range holders {
		if !failed[i] {
			continue
		}
		alive := false
		for _, h := range hs {
			if !failed[h] {
				alive = true
				break
			}
		}
		if !alive {
			return false
		}
	}
	return true
}

// Estimate is a Monte Carlo estimate with its Wilson score interval.
type Estimate struct {
	P, Low, High float64
	Trials       int
}

// MonteCarlo estimates the restart probability with trials random failure
// sets (and, for Random, a new placement each trial). z is the normal
// quantile of the interval (3.29 for 99.9%).
func MonteCarlo(n, k, f int, p Placement, trials int, z float64, rng *rand.Rand) (Estimate, error) {
	if err := check(n, k, f); err != nil {
		return Estimate{}, err
	}
	holders := Holders(n, k, p, rng)
	failed := make([]bool, n)
	ok := 0
	for t := 0; t < trials; t++ {
		if p == Random && t > 0 {
			holders = Holders(n, k, p, rng)
		}
		clear(failed)
		for _, x := range rng.Perm(n)[:f] {
			failed[x] = true
		}
		if Survives(holders, failed) {
			ok++
		}
	}
	return wilson(ok, trials, z), nil
}

func wilson(ok, n int, z float64) Estimate {
	if n == 0 {
		return Estimate{}
	}
	p := float64(ok) / float64(n)
	nn := float64(n)
	den := 1 + z*z/nn
	mid := (p + z*z/(2*nn)) / den
	half := z * math.Sqrt(p*(1-p)/nn+z*z/(4*nn*nn)) / den
	return Estimate{P: p, Low: max(0, mid-half), High: min(1, mid+half), Trials: n}
}

// Tolerable returns the largest f with restart probability >= target (0 if
// even one failure is too many). The probability falls as f grows.
func Tolerable(n, k int, p Placement, target float64) (int, error) {
	if err := check(n, k, 0); err != nil {
		return 0, err
	}
	// P falls fast as f grows: gallop up from 1 to bracket the answer, so
	// that the exact computations (linear in f) stay small.
	lo, hi := 0, 1
	for hi < n {
		pr, err := Exact(n, k, hi, p)
		if err != nil {
			return 0, err
		}
		if pr < target {
			break
		}
		lo, hi = hi, min(2*hi, n)
	}
	if hi == n {
		if pr, _ := Exact(n, k, n, p); pr >= target {
			return n, nil
		}
	}
	hi-- // P(hi+1) < target; the answer is in [lo, hi]
	for lo < hi {
		mid := (lo + hi + 1) / 2
		pr, err := Exact(n, k, mid, p)
		if err != nil {
			return 0, err
		}
		if pr >= target {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo, nil
}

// ReplicasFor returns the smallest k for which a restart after f failures
// has probability >= target, and false if none does (f = n).
func ReplicasFor(n, f int, p Placement, target float64) (int, bool, error) {
	for k := 0; k <= n-1; k++ {
		pr, err := Exact(n, k, f, p)
		if err != nil {
			return 0, false, err
		}
		if pr >= target {
			return k, true, nil
		}
	}
	return 0, false, nil
}
