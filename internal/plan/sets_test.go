package plan_test

import (
	"errors"
	"math"
	"testing"

	"github.com/cairn-hpc/cairn/internal/plan"
)

// TestSetsRing: the holder sets of the ring placement give Exact's ring
// probabilities.
func TestSetsRing(t *testing.T) {
	for _, tc := range []struct{ n, k int }{{4, 1}, {5, 1}, {7, 2}, {9, 3}} {
		var sets [][]int
		for i := range tc.n {
			s := []int{i}
			for j := 1; j <= tc.k; j++ {
				s = append(s, (i+j)%tc.n)
			}
			sets = append(sets, s)
		}
		for f := 0; f <= tc.n; f++ {
			got, err := plan.Sets(tc.n, f, sets)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := plan.Exact(tc.n, tc.k, f, plan.Ring)
			if math.Abs(got-want) > 1e-12 {
				t.Errorf("n %d k %d f %d: Sets %v, Exact %v", tc.n, tc.k, f, got, want)
			}
		}
	}
}

func TestSets(t *testing.T) {
	for _, tc := range []struct {
		name string
		n, f int
		sets [][]int
		want float64
	}{
		{"no copies beyond the first", 4, 1, [][]int{{0}, {1}}, 0.5},
		{"a job on 2 of 5 nodes, k=1", 5, 2, [][]int{{0, 1}, {1, 2}}, 1 - 2.0/10},
		{"an image with no copy", 3, 0, [][]int{{}}, 0},
		{"no failures", 3, 0, [][]int{{0}}, 1},
	} {
		got, err := plan.Sets(tc.n, tc.f, tc.sets)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if _, err := plan.Sets(4096, 3, nil); !errors.Is(err, plan.ErrInput) {
		t.Errorf("4096 nodes, 3 failures: %v, want ErrInput", err)
	}
}
