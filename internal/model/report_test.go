package model_test

import (
	"math"
	"strconv"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
	"github.com/cairn-hpc/cairn/internal/model"
)

// TestReport: the report takes the progress of the rank that reported
// most, sums the copies, and gives the restart odds over where the
// copies of the newest restorable checkpoint are, next to cairn plan's.
func TestReport(t *testing.T) {
	nodes := []string{"a", "b", "c", "d", "e"}
	j := coordv1.Job{RunJob: coordv1.RunJob{Name: "ring", Ranks: 4, Replicas: 1}, Placement: nodes[:4], State: coordv1.JobRunning, Created: t0}
	ck := func(seq int, state coordv1.CkptState, start float64, copies ...[]string) coordv1.Ckpt {
		c := coordv1.Ckpt{Job: "ring", Seq: seq, State: state, Created: at(start), Finished: at(start + 1), Stall: dur(0.5), Coord: dur(0.01), Cont: dur(0.1),
			Copied: []coordv1.CopySpan{{From: at(start + 1), To: at(start + 1.5), Copies: 4, Bytes: 1000}}}
		for r := range 4 {
			c.Ranks = append(c.Ranks, coordv1.CkptRank{Rank: r, Node: nodes[r], Copies: copies[r]})
		}
		return c
	}
	ring := [][]string{{"a", "b"}, {"b", "c"}, {"c", "d"}, {"d", "a"}}
	f := model.Facts{Job: j, Live: nodes[:4], Now: at(60),
		Ckpts: []coordv1.Ckpt{ck(1, coordv1.CkptProtected, 10, ring...), ck(2, coordv1.CkptAborted, 30, ring...)}}
	for i := range 60 {
		for _, rank := range []int{0, 1} {
			if rank == 0 && i%2 == 1 {
				continue
			}
			f.Events = append(f.Events, evv1.Event{Type: evv1.RankEvent, Job: "ring", Rank: evv1.IntPtr(rank), Kind: rankv1.KindProgress,
				Time: at(float64(i)), Message: strconv.Itoa(100 * i)})
		}
	}
	f.Events = append(f.Events, evv1.Event{Type: evv1.RankEvent, Job: "ring", Rank: evv1.IntPtr(2), Kind: "phase", Message: "x"})
	r := model.Report(f)
	if r.Model.Progress == nil || r.Model.Progress.Rank != 1 || r.Model.Progress.Samples != 60 {
		t.Errorf("progress %+v: want rank 1's 60 reports", r.Model.Progress)
	}
	if r.Replication.Copies != 8 || r.Replication.Bytes != 2000 || math.Abs(r.Replication.Time-1) > 1e-9 {
		t.Errorf("replication %+v", r.Replication)
	}
	if len(r.Ckpts) != 2 || r.Nodes != 4 {
		t.Errorf("%d rounds on %d nodes", len(r.Ckpts), r.Nodes)
	}
	for i, want := range []float64{1, 1.0 / 3, 0} {
		o := r.Restart[i]
		if o.Copies == nil || o.Plan == nil || math.Abs(*o.Copies-want) > 1e-12 || math.Abs(*o.Plan-want) > 1e-12 {
			t.Errorf("after %d failures: %+v, want %v", i+1, o, want)
		}
	}
	// A fifth live node holds nothing of the job: more nodes, fewer
	// failure sets fatal.
	f.Live = nodes
	r = model.Report(f)
	if got := *r.Restart[1].Copies; math.Abs(got-(1-4.0/10)) > 1e-12 {
		t.Errorf("2 failures among 5 nodes: %v, want 0.6", got)
	}
	// A copy on a dead node does not count.
	f.Live = []string{"a", "c", "d"}
	r = model.Report(f)
	if got := *r.Restart[0].Copies; math.Abs(got-1.0/3) > 1e-12 {
		t.Errorf("1 failure with b dead: %v, want 1/3 (a and c now hold rank 0's and 1's only copies: only d may fail)", got)
	}
}

// TestDecide: the interval follows the measured cost once there is one,
// and needs an MTBF.
func TestDecide(t *testing.T) {
	j := coordv1.Job{RunJob: coordv1.RunJob{Name: "x", Ranks: 2, CheckpointAuto: true}, Placement: []string{"a", "b"}, State: coordv1.JobRunning, Created: t0}
	f := model.Facts{Job: j, Now: at(100), MTBF: model.MTBF(time.Hour, 0, model.Failures{}, 2)}
	iv := model.Decide(f, at(100))
	if iv == nil || iv.Cost != model.DefaultCost || iv.MTBF != 30*time.Minute || iv.Every != model.Choose(model.DefaultCost, 30*time.Minute).Every {
		t.Fatalf("before any round: %+v", iv)
	}
	f.Ckpts = []coordv1.Ckpt{{Seq: 1, State: coordv1.CkptDurable, Created: at(10), Finished: at(11), Stall: dur(2)}}
	if iv = model.Decide(f, at(100)); iv.Cost != 2*time.Second || iv.Every != model.Choose(2*time.Second, 30*time.Minute).Every {
		t.Fatalf("after a round of 2 s: %+v", iv)
	}
	f.MTBF = model.MTBF(0, 0, model.Failures{}, 2)
	if iv = model.Decide(f, at(100)); iv != nil {
		t.Fatalf("no MTBF: %+v", iv)
	}
}
