package round_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/coord/round"
)

func participants(n int) []round.Participant {
	ps := make([]round.Participant, n)
	for i := range ps {
		ps[i] = round.Participant{Rank: i, Node: "n" + string(rune('0'+i%2))}
	}
	return ps
}

func newRound(t *testing.T, n int) *round.Round {
	t.Helper()
	r, err := round.New(round.Config{Job: "j", Ckpt: 7, Participants: participants(n), Deadline: t0.Add(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// stepAll steps evs at now and returns all their actions; it fails the test
// on an error.
func stepAll(t *testing.T, r *round.Round, now time.Time, evs ...round.Event) []round.Action {
	t.Helper()
	var all []round.Action
	for _, ev := range evs {
		acts, err := r.Step(now, ev)
		if err != nil {
			t.Fatalf("step %T%+v: %v", ev, ev, err)
		}
		all = append(all, acts...)
	}
	return all
}

func TestNewRejects(t *testing.T) {
	deadline := t0.Add(time.Second)
	for _, tc := range []struct {
		name string
		cfg  round.Config
	}{
		{"no participants", round.Config{Deadline: deadline}},
		{"duplicate rank", round.Config{Participants: []round.Participant{{0, "a"}, {0, "b"}}, Deadline: deadline}},
		{"no node", round.Config{Participants: []round.Participant{{0, ""}}, Deadline: deadline}},
		{"no deadline", round.Config{Participants: participants(2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r, err := round.New(tc.cfg); err == nil {
				t.Fatalf("New = %v, want an error", r)
			}
		})
	}
}

func TestRecover(t *testing.T) {
	cfg := round.Config{Participants: participants(3)} // no deadline needed
	for _, s := range []round.State{0, round.StateAborted + 1} {
		if _, err := round.Recover(cfg, s); err == nil {
			t.Errorf("Recover(%d) succeeded, want an error", s)
		}
	}
	for _, tc := range []struct {
		state round.State
		want  []string // actions of Start
	}{
		{round.StatePreparing, []string{`persist-decision aborted "coordinator restarted before the decision"`}},
		{round.StateCommitted, []string{"send-commit r0@n0", "send-commit r1@n1", "send-commit r2@n0"}},
		{round.StateAborted, []string{"send-abort r0@n0", "send-abort r1@n1", "send-abort r2@n0", "done aborted"}},
		{round.StateDurable, []string{"done durable"}},
	} {
		t.Run(tc.state.String(), func(t *testing.T) {
			r, err := round.Recover(cfg, tc.state)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.State(); got != tc.state {
				t.Errorf("State() = %s, want %s", got, tc.state)
			}
			if diff := cmp.Diff(tc.want, strs(stepAll(t, r, t0, round.Start{}))); diff != "" {
				t.Errorf("Start actions (-want +got):\n%s", diff)
			}
		})
	}
}

func strs(acts []round.Action) []string {
	var s []string
	for _, a := range acts {
		s = append(s, a.String())
	}
	return s
}

// TestIgnored checks that an event that does not fit is ignored: the right
// error, no actions, and no change but the Ignored count.
func TestIgnored(t *testing.T) {
	start := []round.Event{round.Start{}}
	prepared := []round.Event{round.Start{}, round.Prepared{Rank: 0}, round.Prepared{Rank: 1}}
	committed := append(prepared[:len(prepared):len(prepared)], round.DecisionPersisted{})
	aborted := []round.Event{round.Start{}, round.Failed{Rank: 0}, round.DecisionPersisted{}}
	for _, tc := range []struct {
		name  string
		setup []round.Event
		ev    round.Event
		want  error
	}{
		{"nil event", start, nil, round.ErrUnexpected},
		{"prepared before start", nil, round.Prepared{Rank: 0}, round.ErrUnexpected},
		{"second start", start, round.Start{}, round.ErrUnexpected},
		{"prepared unknown rank", start, round.Prepared{Rank: 2}, round.ErrUnknownRank},
		{"failed unknown rank", start, round.Failed{Rank: -1}, round.ErrUnknownRank},
		{"lost unknown rank", start, round.Lost{Rank: 5}, round.ErrUnknownRank},
		{"second prepared", []round.Event{round.Start{}, round.Prepared{Rank: 0}}, round.Prepared{Rank: 0}, round.ErrUnexpected},
		{"durable while preparing", start, round.Durable{Rank: 0}, round.ErrUnexpected},
		{"persisted with no decision", start, round.DecisionPersisted{}, round.ErrUnexpected},
		{"durable before commit is persisted", prepared, round.Durable{Rank: 0}, round.ErrUnexpected},
		{"prepared twice after decision", prepared, round.Prepared{Rank: 1}, round.ErrUnexpected},
		{"persisted twice", committed, round.DecisionPersisted{}, round.ErrUnexpected},
		{"durable unknown rank", committed, round.Durable{Rank: 9}, round.ErrUnknownRank},
		{"durable after abort", aborted, round.Durable{Rank: 1}, round.ErrUnexpected},
		{"failed after abort", aborted, round.Failed{Rank: 1}, round.ErrUnexpected},
		{"lost after abort", aborted, round.Lost{Rank: 0}, round.ErrUnexpected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRound(t, 2)
			stepAll(t, r, t0, tc.setup...)
			state, stats := r.State(), r.Stats()
			acts, err := r.Step(t0, tc.ev)
			if !errors.Is(err, tc.want) {
				t.Errorf("Step error = %v, want %v", err, tc.want)
			}
			if len(acts) != 0 {
				t.Errorf("ignored event gave actions %v", acts)
			}
			stats.Ignored++
			if diff := cmp.Diff(stats, r.Stats()); diff != "" || r.State() != state {
				t.Errorf("ignored event changed the round: state %s -> %s, stats (-before +after):\n%s", state, r.State(), diff)
			}
		})
	}
}

// TestDecisionWaitsForPersist checks that whatever arrives after the decision,
// nothing is sent before DecisionPersisted, and then every rank is told.
func TestDecisionWaitsForPersist(t *testing.T) {
	noise := []round.Event{
		round.Prepared{Rank: 0}, round.Prepared{Rank: 2}, round.Durable{Rank: 0}, round.Durable{Rank: 1},
		round.Failed{Rank: 1}, round.Lost{Rank: 2}, round.Tick{}, round.Prepared{Rank: 9}, round.Start{},
	}
	for _, tc := range []struct {
		name   string
		events []round.Event
		at     time.Duration
		want   round.State
		commit bool // Commit is sent (a commit decision stands even if the round then ends aborted)
	}{
		{"all prepared", []round.Event{round.Prepared{Rank: 0}, round.Prepared{Rank: 1}, round.Prepared{Rank: 2}}, 0, round.StateCommitted, true},
		{"failed", []round.Event{round.Prepared{Rank: 0}, round.Failed{Rank: 2}}, 0, round.StateAborted, false},
		{"lost", []round.Event{round.Lost{Rank: 1}}, 0, round.StateAborted, false},
		{"deadline", []round.Event{round.Tick{}}, 10 * time.Second, round.StateAborted, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRound(t, 3)
			stepAll(t, r, t0, round.Start{})
			now := t0.Add(tc.at)
			acts := stepAll(t, r, now, tc.events...)
			if diff := cmp.Diff([]round.Action{round.PersistDecision{State: tc.want, Reason: reasonOf(acts)}}, acts); diff != "" {
				t.Fatalf("decision actions (-want +got):\n%s", diff)
			}
			for _, ev := range noise {
				acts, _ := r.Step(now, ev)
				if len(acts) != 0 {
					t.Fatalf("%T%+v before the decision is persisted gave %v", ev, ev, acts)
				}
			}
			acts = stepAll(t, r, now, round.DecisionPersisted{})
			var told []int
			for _, a := range acts {
				switch a := a.(type) {
				case round.SendCommit:
					if !tc.commit {
						t.Errorf("sent %v after an abort decision", a)
					}
					told = append(told, a.Rank)
				case round.SendAbort:
					if tc.commit {
						t.Errorf("sent %v after a commit decision", a)
					}
					told = append(told, a.Rank)
				}
			}
			if diff := cmp.Diff([]int{0, 1, 2}, told); diff != "" {
				t.Errorf("ranks told (-want +got):\n%s", diff)
			}
			if !r.Done() || r.State() != round.StateAborted {
				t.Errorf("after noise with failures, round is %s, done %t; want aborted, done", r.State(), r.Done())
			}
		})
	}
}

func reasonOf(acts []round.Action) string {
	if len(acts) == 1 {
		if d, ok := acts[0].(round.PersistDecision); ok {
			return d.Reason
		}
	}
	return ""
}

func TestStats(t *testing.T) {
	r := newRound(t, 2)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	stepAll(t, r, at(0), round.Start{})
	stepAll(t, r, at(1*time.Second), round.Prepared{Rank: 1, ImageSize: 300, Dump: 700 * time.Millisecond})
	stepAll(t, r, at(2*time.Second), round.Prepared{Rank: 0, ImageSize: 100, Dump: 1500 * time.Millisecond})
	stepAll(t, r, at(2200*time.Millisecond), round.DecisionPersisted{})
	stepAll(t, r, at(4*time.Second), round.Durable{Rank: 0})
	acts := stepAll(t, r, at(7*time.Second), round.Durable{Rank: 1})
	want := []round.Action{
		round.PersistState{State: round.StateDurable},
		round.Done{State: round.StateDurable, Stats: round.Stats{
			Prepare: 2 * time.Second, Persist: 200 * time.Millisecond, Stall: 2200 * time.Millisecond,
			MaxDump: 1500 * time.Millisecond, Coord: 700 * time.Millisecond, Ingest: 4800 * time.Millisecond,
			Bytes: 400,
			Ranks: []round.RankStats{
				{Participant: round.Participant{Rank: 0, Node: "n0"}, State: round.RankDurable, Size: 100,
					Dump: 1500 * time.Millisecond, Prepare: 2 * time.Second, Durable: 1800 * time.Millisecond},
				{Participant: round.Participant{Rank: 1, Node: "n1"}, State: round.RankDurable, Size: 300,
					Dump: 700 * time.Millisecond, Prepare: 1 * time.Second, Durable: 4800 * time.Millisecond},
			},
		}},
	}
	if diff := cmp.Diff(want, acts); diff != "" {
		t.Errorf("final actions (-want +got):\n%s", diff)
	}
}

// TestClockNeverGoesBack checks that an event stamped before an earlier one
// is taken as happening at the latest time seen.
func TestClockNeverGoesBack(t *testing.T) {
	r := newRound(t, 1)
	stepAll(t, r, t0.Add(11*time.Second), round.Tick{})
	if acts := stepAll(t, r, t0, round.Start{}); len(acts) != 1 {
		t.Fatalf("Start after the deadline, stamped before it: %v, want only an abort decision", acts)
	}
}
