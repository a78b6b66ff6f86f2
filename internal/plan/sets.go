package plan

import (
	"fmt"
	"math"
	"slices"
)

// MaxFailureSets bounds the failure sets Sets counts.
const MaxFailureSets = 2_000_000

// Sets returns the probability that a job whose rank images are held by
// the given node sets (each a set of node numbers in [0, n): the nodes
// holding a copy of one image) can restart after f simultaneous failures
// among n nodes, chosen uniformly at random: that the failed nodes hold
// every copy of no image. It counts every one of the C(n, f) failure
// sets, so it refuses (ErrInput) more than MaxFailureSets of them.
func Sets(n, f int, sets [][]int) (float64, error) {
	if n < 1 || f < 0 || f > n {
		return 0, fmt.Errorf("%w: %d failures of %d nodes", ErrInput, f, n)
	}
	if c := math.Exp(lchoose(n, f)); c > MaxFailureSets {
		return 0, fmt.Errorf("%w: %.3g failure sets of %d nodes, more than %d", ErrInput, c, n, MaxFailureSets)
	}
	// Only sets of at most f nodes can fail whole; a set that holds
	// another fails only with it.
	var small [][]int
	for _, s := range sets {
		s = slices.Compact(slices.Sorted(slices.Values(s)))
		if len(s) == 0 {
			return 0, nil // an image with no copy is lost already
		}
		for _, x := range s {
			if x < 0 || x >= n {
				return 0, fmt.Errorf("%w: node %d of %d", ErrInput, x, n)
			}
		}
		if len(s) <= f {
			small = append(small, s)
		}
	}
	failed := make([]bool, n)
	combo := make([]int, f)
	var total, ok int
	var walk func(from, depth int)
	walk = func(from, depth int) {
		if depth == f {
			total++
			for _, s := range small {
				all := true
				for _, x := range s {
					if !failed[x] {
						all = false
						break
					}
				}
				if all {
					return
				}
			}
			ok++
			return
		}
		for i := from; i <= n-(f-depth); i++ {
			combo[depth] = i
			failed[i] = true
			walk(i+1, depth+1)
			failed[i] = false
		}
	}
	walk(0, 0)
	return float64(ok) / float64(total), nil
}
