package round_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/coord/round"
)

// TestRandomRounds steps seeded random event sequences (duplicates, unknown
// ranks, acknowledgments out of place, recoveries) through rounds, then
// drives each round to its end, checking the protocol's invariants after
// every step. Each sequence runs twice to check that it is deterministic.
func TestRandomRounds(t *testing.T) {
	seeds := 3000
	if testing.Short() {
		seeds = 300
	}
	for seed := range uint64(seeds) {
		first := randomRound(t, seed)
		if t.Failed() {
			return
		}
		if diff := cmp.Diff(first, randomRound(t, seed)); diff != "" {
			t.Fatalf("seed %d: not deterministic (-first +second):\n%s", seed, diff)
		}
	}
}

// randomRound runs one random round and returns its log of actions and
// errors.
func randomRound(t *testing.T, seed uint64) (log []string) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("seed %d: panic: %v\n%v", seed, p, log)
		}
	}()
	rng := rand.New(rand.NewPCG(seed, 0))
	n := 1 + rng.IntN(5)
	now := t0
	cfg := round.Config{Job: "job", Ckpt: seed, Deadline: now.Add(time.Duration(1+rng.IntN(20)) * time.Second)}
	for i := range n {
		cfg.Participants = append(cfg.Participants, round.Participant{Rank: i, Node: fmt.Sprintf("n%d", i%3)})
	}
	c := &checker{n: n, commits: map[int]int{}, aborts: map[int]int{}}
	var r *round.Round
	var err error
	if rng.IntN(5) == 0 {
		c.recovered = round.State(1 + rng.IntN(4))
		r, err = round.Recover(cfg, c.recovered)
	} else {
		r, err = round.New(cfg)
	}
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	step := func(ev round.Event) {
		if _, ok := ev.(round.DecisionPersisted); ok && c.decision != 0 {
			c.acked = true
		}
		acts, err := r.Step(now, ev)
		log = append(log, fmt.Sprintf("%T%+v", ev, ev))
		for _, a := range acts {
			log = append(log, a.String())
			if msg := c.action(a); msg != "" {
				t.Fatalf("seed %d: after %T%+v: %s\n%v", seed, ev, ev, msg, log)
			}
		}
		if err != nil {
			log = append(log, err.Error())
		}
	}
	step(round.Start{})
	for range rng.IntN(40) {
		now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
		rk := rng.IntN(n + 1) // n is not in the round
		switch k := rng.IntN(100); {
		case k < 30:
			step(round.Prepared{Rank: rk, ImageSize: rng.Int64N(1 << 20), Dump: time.Duration(rng.IntN(3000)) * time.Millisecond})
		case k < 35:
			step(round.Failed{Rank: rk, Reason: "random"})
		case k < 40:
			step(round.Lost{Rank: rk})
		case k < 65:
			step(round.Durable{Rank: rk})
		case k < 80:
			step(round.Tick{})
		case k < 97:
			step(round.DecisionPersisted{})
		default:
			step(round.Start{})
		}
	}
	// Drive the round to its end, as a driver that keeps going would.
	now = now.Add(time.Hour)
	step(round.Tick{})
	step(round.DecisionPersisted{})
	for i := range n {
		step(round.Durable{Rank: i})
	}
	if msg := c.end(r); msg != "" {
		t.Fatalf("seed %d: %s\n%v", seed, msg, log)
	}
	return log
}

// checker watches a round's actions for violations of the protocol.
type checker struct {
	n         int
	recovered round.State // the state the round was recovered in, or 0
	decision  round.State // from PersistDecision
	acked     bool        // DecisionPersisted was stepped after PersistDecision
	commits   map[int]int
	aborts    map[int]int
	persisted []round.State // from PersistState
	done      []round.Done
}

// action checks one action and returns what is wrong with it.
func (c *checker) action(a round.Action) string {
	if len(c.done) > 0 {
		return fmt.Sprintf("%s after Done", a)
	}
	switch a := a.(type) {
	case round.SendPrepare:
		if c.decision != 0 || c.recovered != 0 {
			return "prepare after a decision or a recovery"
		}
	case round.PersistDecision:
		if c.decision != 0 {
			return "second decision"
		}
		if c.recovered != 0 && c.recovered != round.StatePreparing {
			return fmt.Sprintf("decision in a round recovered %s", c.recovered)
		}
		if a.State != round.StateCommitted && a.State != round.StateAborted {
			return fmt.Sprintf("decision %s", a.State)
		}
		c.decision = a.State
	case round.SendCommit:
		if !(c.decision == round.StateCommitted && c.acked || c.recovered == round.StateCommitted) {
			return "commit before the commit decision was persisted"
		}
		if len(c.aborts) > 0 {
			return "commit after abort"
		}
		c.commits[a.Rank]++
	case round.SendAbort:
		if !(c.decision == round.StateAborted && c.acked || c.recovered == round.StateAborted) {
			return "abort before the abort decision was persisted"
		}
		if len(c.commits) > 0 {
			return "abort after commit"
		}
		c.aborts[a.Rank]++
	case round.PersistState:
		if len(c.persisted) > 0 {
			return "second final state"
		}
		if len(c.commits) != c.n {
			return fmt.Sprintf("final state %s before every rank got Commit", a.State)
		}
		c.persisted = append(c.persisted, a.State)
	case round.Done:
		c.done = append(c.done, a)
	}
	return ""
}

// end checks a round that should have ended.
func (c *checker) end(r *round.Round) string {
	if len(c.done) != 1 || !r.Done() {
		return fmt.Sprintf("round did not end: %d Done actions, Done() = %t", len(c.done), r.Done())
	}
	d := c.done[0]
	if d.State != round.StateDurable && d.State != round.StateAborted {
		return fmt.Sprintf("ended in %s", d.State)
	}
	if r.State() != d.State {
		return fmt.Sprintf("Done says %s, State() says %s", d.State, r.State())
	}
	if len(c.persisted) == 1 && c.persisted[0] != d.State {
		return fmt.Sprintf("persisted %s, ended %s", c.persisted[0], d.State)
	}
	if c.recovered == round.StateDurable {
		return ""
	}
	// A decision was persisted: every participant heard it exactly once.
	told := c.commits
	if d.State == round.StateAborted && len(c.commits) == 0 {
		told = c.aborts
	}
	for i := range c.n {
		if told[i] != 1 {
			return fmt.Sprintf("rank %d told %d times (commits %v, aborts %v)", i, told[i], c.commits, c.aborts)
		}
	}
	if len(told) != c.n {
		return fmt.Sprintf("messages to ranks not in the round: %v", told)
	}
	if d.State == round.StateDurable {
		for _, rk := range d.Stats.Ranks {
			if rk.State != round.RankDurable {
				return fmt.Sprintf("durable round with rank %d %s", rk.Rank, rk.State)
			}
		}
	}
	return ""
}
