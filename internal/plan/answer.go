package plan

import "math/rand/v2"

// Query is a planning question about a job using all of Nodes nodes with
// Replicas replicas of every node's images.
type Query struct {
	Nodes, Replicas int
	// Failures, when not nil, asks for the restart probability after that
	// many simultaneous failures; with Target > 0 also for the fewest
	// replicas that reach Target, and with Trials > 0 for a Monte Carlo
	// estimate (99.9% interval) drawn from Rand.
	Failures *int
	Target   float64
	Trials   int
	Rand     *rand.Rand
}

// Row answers a Query for one placement.
type Row struct {
	Placement  string    `json:"placement"`
	Replicas   int       `json:"replicas"`
	Failures   int       `json:"failures,omitempty"`
	P          *float64  `json:"p_restart,omitempty"`
	MonteCarlo *Estimate `json:"monte_carlo,omitempty"`
	// Tolerable are the failures survived with probability 90%, 99% and
	// 99.9%, by those names.
	Tolerable map[string]int `json:"tolerable_failures"`
	Needed    *int           `json:"replicas_needed,omitempty"`
	NeededP   float64        `json:"p_with_replicas_needed,omitempty"`
}

// Tolerances are the probabilities Row.Tolerable is given for.
var Tolerances = []struct {
	Name string
	P    float64
}{{"90%", 0.90}, {"99%", 0.99}, {"99.9%", 0.999}}

// Answer answers q for each placement, in order.
func Answer(q Query, places []Placement) ([]Row, error) {
	n, k := q.Nodes, q.Replicas
	var rows []Row
	for _, p := range places {
		r := Row{Placement: p.String(), Replicas: k, Tolerable: map[string]int{}}
		if q.Failures != nil {
			f := *q.Failures
			r.Failures = f
			pr, err := Exact(n, k, f, p)
			if err != nil {
				return nil, err
			}
			r.P = &pr
			if q.Trials > 0 {
				est, err := MonteCarlo(n, k, f, p, q.Trials, 3.29, q.Rand)
				if err != nil {
					return nil, err
				}
				r.MonteCarlo = &est
			}
			if q.Target > 0 {
				need, ok, err := ReplicasFor(n, f, p, q.Target)
				if err != nil {
					return nil, err
				}
				if ok {
					r.Needed = &need
					r.NeededP, _ = Exact(n, need, f, p)
				}
			}
		}
		for _, t := range Tolerances {
			tol, err := Tolerable(n, k, p, t.P)
			if err != nil {
				return nil, err
			}
			r.Tolerable[t.Name] = tol
		}
		rows = append(rows, r)
	}
	return rows, nil
}
