package test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"cairn/internal/ringapp"
	"cairn/internal/testutil"
)

// Migration is `cairn migrate --json`.
type Migration struct {
	Seq     int           `json:"seq"`
	Rank    int           `json:"rank"`
	From    string        `json:"from"`
	To      string        `json:"to"`
	State   string        `json:"state"`
	Reason  string        `json:"reason"`
	Stall   time.Duration `json:"stall_ns"`
	Bytes   int64         `json:"bytes"`
	Move    time.Duration `json:"move_ns"`
	Restore time.Duration `json:"restore_ns"`
}

// Event is a line of `cairn events --json`.
type Event struct {
	Seq     uint64 `json:"seq"`
	Type    string `json:"type"`
	Job     string `json:"job"`
	Node    string `json:"node"`
	Peer    string `json:"peer"`
	Rank    *int   `json:"rank"`
	Ckpt    int    `json:"ckpt"`
	Message string `json:"message"`
}

func events(t *testing.T, c *testutil.Cluster, args ...string) []Event {
	t.Helper()
	var out []Event
	for _, line := range strings.Split(strings.TrimSpace(c.OK(append([]string{"events", "--json"}, args...)...)), "\n") {
		if line == "" {
			continue
		}
		var e Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// migrationPhases is the order of a migration's events.
var migrationPhases = []string{"migration.started", "migration.stalled", "migration.moved", "migration.restored", "migration.done"}

// checkPhases checks that the events of migration seq are its phases, in
// order.
func checkPhases(t *testing.T, evs []Event, seq int, want []string) {
	t.Helper()
	var got []string
	for _, e := range evs {
		if strings.HasPrefix(e.Type, "migration.") && e.Ckpt == seq {
			got = append(got, e.Type)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events of migration %d: %v, want %v", seq, got, want)
	}
}

func migrate(t *testing.T, c *testutil.Cluster, args ...string) Migration {
	t.Helper()
	var m Migration
	if err := json.Unmarshal([]byte(c.OK(append([]string{"migrate", "--json"}, args...)...)), &m); err != nil {
		t.Fatal(err)
	}
	t.Logf("rank %d %s -> %s: %s, job stalled %s, %d bytes moved in %s, restored in %s", m.Rank, m.From, m.To, m.State,
		m.Stall.Round(time.Millisecond), m.Bytes, m.Move.Round(time.Millisecond), m.Restore.Round(time.Millisecond))
	return m
}

// TestMigrateRank: a rank of the running ring moves twice, to two other
// nodes, while the ring passes checksummed messages at full speed. The
// job finishes with the result of an uninterrupted run (the ring fails on
// any lost, duplicated or reordered message), the other ranks were never
// restarted (same processes), and the events show every phase in order.
func TestMigrateRank(t *testing.T) {
	const messages = 1_500_000
	c := testutil.NewCluster(t, 4)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "3", "--per-node", "1"}, ringArgs(c, messages)...)...)
	st := c.Status("ring")
	place := st.Placement
	var free string
	for _, n := range c.Nodes {
		if !slices.Contains(place, n) {
			free = n
		}
	}
	c.WaitProgress("ring", 3, 0, 60*time.Second)
	pids := map[int]int{}
	for _, r := range st.RankStates {
		pids[r.Rank] = r.Pid
	}

	first := migrate(t, c, "ring/1", "--to", free)
	if first.State != "done" || first.From != place[1] || first.To != free {
		t.Fatalf("first migration: %+v", first)
	}
	before := c.Progress("ring", 0)
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		return c.Progress("ring", 0) > before, "the ring made no progress after the migration"
	})
	// Back to where it came from: a different node than the first move's.
	second := migrate(t, c, "ring/1", "--to", place[0])
	if second.State != "done" || second.To != place[0] {
		t.Fatalf("second migration: %+v", second)
	}
	after := c.Status("ring")
	if got := after.Placement[1]; got != place[0] {
		t.Fatalf("rank 1 on %s after two moves, want %s", got, place[0])
	}
	for _, r := range after.RankStates {
		if r.Rank != 1 && r.Pid != pids[r.Rank] {
			t.Errorf("rank %d was restarted: pid %d, was %d", r.Rank, r.Pid, pids[r.Rank])
		}
	}
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	evs := events(t, c, "--job", "ring")
	checkPhases(t, evs, first.Seq, migrationPhases)
	checkPhases(t, evs, second.Seq, migrationPhases)
	out := c.OK("migrations", "ring")
	if strings.Count(out, " done ") != 2 {
		t.Errorf("cairn migrations lists:\n%s", out)
	}
}
