package dashboard_test

import (
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/dashboard"

	"github.com/google/go-cmp/cmp"
)

// TestTimeline: checkpoints, migrations and the job's events become
// entries in time order; node failures only of nodes that held the job's
// ranks or images, after the job was created; other jobs' events and the
// events a record already tells are left out.
func TestTimeline(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	j := coordv1.Job{RunJob: coordv1.RunJob{Name: "ring", Ranks: 2, Replicas: 1}, Placement: []string{"a", "d"}, Created: at(0)}
	cks := []coordv1.Ckpt{
		{Seq: 1, State: coordv1.CkptProtected, Created: at(10), Stall: 250 * time.Millisecond, Bytes: 3 << 20,
			Ranks: []coordv1.CkptRank{{Rank: 0, Node: "a", Copies: []string{"a", "b"}}, {Rank: 1, Node: "c", Copies: []string{"c", "a"}}}},
		{Seq: 3, State: coordv1.CkptDurable, Created: at(30), Periodic: true,
			Ranks: []coordv1.CkptRank{{Rank: 0, Node: "a", Copies: []string{"a"}}, {Rank: 1, Node: "d", Copies: []string{"d", "b"}}}},
		{Seq: 4, State: coordv1.CkptAborted, Created: at(40), Reason: "rank 1: dump timed out"},
	}
	ms := []coordv1.Migration{{Seq: 2, Rank: 1, From: "c", To: "d", State: coordv1.MigrationDone, Started: at(20), Stall: time.Second, Bytes: 1 << 20}}
	evs := []evv1.Event{
		{Type: evv1.JobStarted, Job: "ring", Time: at(0), Message: "2 ranks on a,c"},
		{Type: evv1.CkptCommitted, Job: "ring", Ckpt: 1, Time: at(11)},
		{Type: evv1.ReplicaCopied, Job: "ring", Ckpt: 1, Node: "b", Time: at(12)},
		{Type: evv1.NodeLost, Node: "c", Time: at(-5)},      // before the job
		{Type: evv1.NodeLost, Node: "e", Time: at(45)},      // never the job's
		{Type: evv1.NodeLost, Node: "b", Time: at(50)},      // held copies
		{Type: evv1.JobStarted, Job: "other", Time: at(51)}, // another job's
		{Type: evv1.ReplicaFailed, Job: "ring", Ckpt: 3, Rank: evv1.IntPtr(0), Node: "e", Peer: "a", Time: at(52), Message: "no space"},
		{Type: evv1.JobRestarting, Job: "ring", Ckpt: 3, Time: at(60), Message: "onto a,d"},
		{Type: evv1.JobRestarted, Job: "ring", Ckpt: 3, Time: at(62), Duration: 2 * time.Second, Message: "on a,d"},
	}
	type row struct {
		S                  int
		Kind, Title, State string
		Detail             string
		Protected          bool
	}
	var got []row
	for _, e := range dashboard.Timeline(j, cks, ms, evs) {
		got = append(got, row{int(e.Time.Sub(t0) / time.Second), e.Kind, e.Title, e.State, e.Detail, e.Protected})
	}
	want := []row{
		{0, "start", "started", "", "2 ranks on a,c", false},
		{10, "checkpoint", "checkpoint 1", "protected", "stall 250ms · 3.0 MiB · 2 of 2 copies of every rank image · protected", true},
		{20, "migration", "rank 1 moved c → d", "done", "stall 1s · 1.0 MiB moved", false},
		{30, "checkpoint", "checkpoint 3 (periodic)", "durable", "1 of 2 copies of every rank image · not protected", false},
		{40, "checkpoint", "checkpoint 4", "aborted", "rank 1: dump timed out", false},
		{50, "failure", "node b lost", "dead", "", false},
		{52, "copy", "copy of rank 0 of checkpoint 3 to e failed", "failed", "no space", false},
		{60, "restart", "restarting from checkpoint 3", "restarting", "onto a,d", false},
		{62, "restart", "restarted from checkpoint 3", "done", "on a,d in 2s", false},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("timeline (-want +got):\n%s", d)
	}
}
