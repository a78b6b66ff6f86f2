package ops

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestHealthWarningMigrates: a node's health probe (a command of the
// operator's) goes bad while a ring job with the migrate policy has a rank
// there: the rank moves to the spare by itself (and goes on there from its
// image), the ring finishes with the right result, and the event stream
// shows the warning, then every phase of the migration in order.
func TestHealthWarningMigrates(t *testing.T) {
	const messages = 1_500_000
	dir := t.TempDir()
	c := testutil.NewCluster(t, 4, "--health-cmd", "test ! -e "+dir+"/sick-$CAIRN_NODE || { echo disk failing; exit 1; }", "--health-every", "500ms")
	spare := c.Nodes[3]
	c.OK("node", "spare", spare)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "3", "--per-node", "1", "--on-health-warning", "migrate"}, c.RingArgs(messages)...)...)
	place := c.Status("ring").Placement
	c.WaitProgress("ring", 3, 0, 60*time.Second)
	sick := place[1]
	if err := os.WriteFile(filepath.Join(dir, "sick-"+sick), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var moved evv1.Event
	testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
		evs := c.Events("--type", "migration.done")
		i := slices.IndexFunc(evs, func(e evv1.Event) bool { return e.Node == spare })
		if i >= 0 {
			moved = evs[i]
		}
		return i >= 0, "rank 1 has not moved to the spare"
	})
	if p := c.Status("ring").Placement; p[1] != spare {
		t.Fatalf("rank 1 on %s, want the spare %s", p[1], spare)
	}
	c.CheckRestored("ring", 1, moved.Ckpt, testutil.RingOutput)
	var warned uint64
	var phases []string
	for _, e := range c.Events() {
		switch {
		case e.Type == "health.warning" && e.Node == sick:
			if !strings.Contains(e.Message, "disk failing") {
				t.Errorf("warning says %q", e.Message)
			}
			warned = e.Seq
		case strings.HasPrefix(e.Type, "migration.") && warned > 0:
			phases = append(phases, e.Type)
		}
	}
	if warned == 0 || !slices.Equal(phases, testutil.MigrationPhases) {
		t.Fatalf("events: warning at %d, then %v; want the warning, then %v", warned, phases, testutil.MigrationPhases)
	}
	var nodes []struct {
		Name   string   `json:"name"`
		Health []string `json:"health"`
	}
	if err := json.Unmarshal([]byte(c.OK("nodes", "--json")), &nodes); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if (n.Name == sick) != (len(n.Health) > 0) {
			t.Errorf("node %s reports health %q", n.Name, n.Health)
		}
	}
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	// The node gets well: the warning clears.
	os.Remove(filepath.Join(dir, "sick-"+sick))
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		for _, e := range c.Events("--type", "health.ok") {
			if e.Node == sick {
				return true, ""
			}
		}
		return false, "no health.ok for " + sick
	})
}

// TestEventsLateSubscriberAndHooks: a subscriber that comes late with
// --since gets what it missed and then the live events, in order and
// without gaps; a hook that keeps failing is retried, its failure is
// reported as an event, and it holds nothing up: a round runs to its end
// while the hook is still stuck on the previous round's event; a working
// hook gets every event.
func TestEventsLateSubscriberAndHooks(t *testing.T) {
	dir := t.TempDir()
	tries := filepath.Join(dir, "tries")
	release := filepath.Join(dir, "release")
	got := filepath.Join(dir, "got")
	// The failing hook notes the event of every attempt, then hangs until
	// the test releases it (or its 10 s timeout kills it), then fails.
	c := testutil.NewCluster(t, 2,
		"--hook", "checkpoint.durable=exec:echo $CAIRN_EVENT_SEQ >> "+tries+"; while [ ! -e "+release+" ]; do sleep 0.1; done; echo pager unreachable >&2; exit 7",
		"--hook", "*=exec:echo $CAIRN_EVENT_TYPE >> "+got)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--replicas", "0"}, c.RingArgs(1_000_000_000)...)...)
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	c.OK("checkpoint", "ring")
	past := c.Events()
	since := past[len(past)/2].Seq // the subscriber missed the rest
	durable := func(seq int) evv1.Event {
		t.Helper()
		for _, e := range c.Events("--type", "checkpoint.durable") {
			if e.Ckpt == seq {
				return e
			}
		}
		t.Fatalf("no checkpoint.durable event for round %d", seq)
		return evv1.Event{}
	}
	durable1 := durable(1)
	attempts := func() []string {
		b, _ := os.ReadFile(tries)
		return strings.Fields(string(b))
	}
	// The failing hook is stuck on round 1's event before round 2 begins.
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		return slices.Contains(attempts(), fmt.Sprint(durable1.Seq)), fmt.Sprintf("the failing hook never ran for event %d: %v", durable1.Seq, attempts())
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := exec.CommandContext(ctx, c.Bin, "--data", c.Data, "events", "--follow", "--json", "--since", fmt.Sprint(since))
	out, err := sub.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	defer sub.Wait()
	defer cancel()
	c.OK("checkpoint", "ring")
	// Round 2 ended while the hook, released only below, was stuck on
	// round 1's event: short of its 4 attempts timing out (4 x 10 s), it
	// cannot have given up on it yet. Had the round waited for the hook,
	// its durable event would come after the hook's failure.
	durable2 := durable(2)
	for _, e := range c.Events("--type", "hook.failed") {
		if e.Seq < durable2.Seq {
			t.Fatalf("hook.failed (event %d, %s) before round 2's durable event %d (%s): the round waited for the failing hook", e.Seq, e.Time, durable2.Seq, durable2.Time)
		}
	}
	// Read until the second round's durable event, then check for gaps.
	var seqs []uint64
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var e evv1.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, e.Seq)
		if e.Type == "checkpoint.durable" && e.Ckpt == 2 {
			break
		}
	}
	if len(seqs) == 0 || seqs[0] != since+1 {
		t.Fatalf("late subscriber's first event is %v, want %d", seqs, since+1)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("late subscriber got %v: a gap or disorder", seqs)
		}
	}
	if seqs[len(seqs)-1] <= past[len(past)-1].Seq {
		t.Fatalf("late subscriber got no live event: %v", seqs)
	}
	// The failing hook, released: retried, then reported, for each event.
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
		n := 0
		for _, e := range c.Events("--type", "hook.failed") {
			if strings.Contains(e.Message, "after 4 attempts") && strings.Contains(e.Message, "pager unreachable") {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d hook failures reported, want 2", n)
	})
	want := slices.Repeat([]string{fmt.Sprint(durable1.Seq)}, 4)
	want = append(want, slices.Repeat([]string{fmt.Sprint(durable2.Seq)}, 4)...)
	if ran := attempts(); !slices.Equal(ran, want) {
		t.Errorf("the failing hook ran for events %v, want 4 attempts for each of %d and %d", ran, durable1.Seq, durable2.Seq)
	}
	b, _ := os.ReadFile(got)
	for _, want := range []string{"job.started", "checkpoint.committed", "checkpoint.durable", "node.joined"} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("the catch-all hook never got %s:\n%s", want, b)
		}
	}
	if strings.Contains(string(b), "hook.failed") {
		t.Error("a hook was handed hook.failed events")
	}
	c.OK("kill", "ring")
}
