package plan_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/cairn-hpc/cairn/internal/plan"
)

// TestAnswer: a row holds what Exact, Tolerable and ReplicasFor say, and
// bad parameters are ErrInput.
func TestAnswer(t *testing.T) {
	f := 4
	q := plan.Query{Nodes: 64, Replicas: 1, Failures: &f, Target: 0.99, Trials: 1000, Rand: rand.New(rand.NewPCG(1, 2))}
	rows, err := plan.Answer(q, []plan.Placement{plan.Ring, plan.Pairs})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Placement != "ring" || rows[1].Placement != "pairs" {
		t.Fatalf("rows %+v", rows)
	}
	for i, p := range []plan.Placement{plan.Ring, plan.Pairs} {
		r := rows[i]
		want, _ := plan.Exact(64, 1, 4, p)
		if r.P == nil || *r.P != want || r.MonteCarlo == nil || r.Failures != 4 {
			t.Errorf("%s: P %v MonteCarlo %v, want P %v", p, r.P, r.MonteCarlo, want)
		}
		need, _, _ := plan.ReplicasFor(64, 4, p, 0.99)
		if r.Needed == nil || *r.Needed != need || r.NeededP < 0.99 {
			t.Errorf("%s: needed %v (P %v), want %d", p, r.Needed, r.NeededP, need)
		}
		for _, tol := range plan.Tolerances {
			want, _ := plan.Tolerable(64, 1, p, tol.P)
			if r.Tolerable[tol.Name] != want {
				t.Errorf("%s: tolerable at %s %d, want %d", p, tol.Name, r.Tolerable[tol.Name], want)
			}
		}
	}
	rows, err = plan.Answer(plan.Query{Nodes: 8, Replicas: 2}, []plan.Placement{plan.Random})
	if err != nil || rows[0].P != nil || rows[0].MonteCarlo != nil || rows[0].Needed != nil {
		t.Errorf("without failures: %+v %v", rows, err)
	}
	if _, err := plan.Answer(plan.Query{Nodes: 4, Replicas: 4}, []plan.Placement{plan.Ring}); !errors.Is(err, plan.ErrInput) {
		t.Errorf("4 replicas of 4 nodes: %v, want ErrInput", err)
	}
}
