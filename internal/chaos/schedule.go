package chaos

import (
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"time"
)

// Kind is what a fault does to a node.
type Kind string

// Fault kinds.
const (
	Fail   Kind = "fail"   // the node stops: its agent and ranks killed
	Repair Kind = "repair" // the node comes back: its agent started again
)

// Fault is one step of a schedule: at At (since failures began), Node
// fails or is repaired.
type Fault struct {
	At   time.Duration `json:"at_ns"`
	Node string        `json:"node"`
	Kind Kind          `json:"kind"`
}

// Schedule is the faults of a run, seeded: each node is up for an
// exponential time of mean MTBF (a constant failure rate, as the
// checkpoint interval's model assumes), fails, is down for Repair, comes
// back, and so on. Every node draws from a generator of its own, seeded
// by the run's seed and the node's name: a node's faults do not depend on
// which other nodes there are, and the same seed gives the same faults.
type Schedule struct {
	mtbf, repair time.Duration
	nodes        []*nodeClock
}

// nodeClock is one node's next fault.
type nodeClock struct {
	name string
	rng  *rand.Rand
	next time.Duration
	down bool // the next fault is its repair
}

// NewSchedule returns the schedule of seed for nodes, each failing at a
// mean time between failures mtbf (> 0) and repaired repair after it
// fails.
func NewSchedule(seed uint64, nodes []string, mtbf, repair time.Duration) *Schedule {
	s := &Schedule{mtbf: mtbf, repair: repair}
	for _, n := range slices.Sorted(slices.Values(nodes)) {
		h := fnv.New64a()
		h.Write([]byte(n))
		c := &nodeClock{name: n, rng: rand.New(rand.NewPCG(seed, h.Sum64()))}
		c.next = s.uptime(c)
		s.nodes = append(s.nodes, c)
	}
	return s
}

// uptime draws how long a node stays up.
func (s *Schedule) uptime(c *nodeClock) time.Duration {
	return time.Duration(c.rng.ExpFloat64() * float64(s.mtbf))
}

// Next returns the next fault in time order (of two at the same time,
// the node first in name order's). A schedule without nodes has no
// faults: ok is false.
func (s *Schedule) Next() (f Fault, ok bool) {
	if len(s.nodes) == 0 {
		return Fault{}, false
	}
	c := s.nodes[0]
	for _, n := range s.nodes[1:] {
		if n.next < c.next {
			c = n
		}
	}
	f = Fault{At: c.next, Node: c.name, Kind: Fail}
	if c.down {
		f.Kind = Repair
		c.next += s.uptime(c)
	} else {
		c.next += s.repair
	}
	c.down = !c.down
	return f, true
}
