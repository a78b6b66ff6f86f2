package ops

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
	"github.com/cairn-hpc/cairn/internal/model"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestReport is `cairn report` on the ring job with one replica after
// three checkpoints: its run is the span of rank 0's progress reports on
// the event stream, and its work what they count; each checkpoint's stall
// is when the events say the round froze and thawed the ranks, and no
// shorter than any rank's dump as its agent timed it; the measured terms
// of the run time add up to the run time measured, within the noise the
// report states and derives from the job's own rate; and the odds of a
// restart after 1, 2 and 3 node failures are those of 4 nodes each
// copying to the next.
func TestReport(t *testing.T) {
	c := testutil.NewCluster(t, 4)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "4", "--per-node", "1", "--replicas", "1"},
		append(c.RingArgs(20*testutil.RingMessages), "-progress", "500ms")...)...)
	c.WaitProgress("ring", 4, 0, 60*time.Second)
	// The job's progress reaches the coordinator as rank 0's events of
	// kind progress, which the ring sends through the rank API from
	// inside its container.

	time.Sleep(5 * time.Second)
	for i := 1; i <= 3; i++ {
		c.OK("checkpoint", "ring")
		testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
			cks := c.Ckpts("ring")
			return cks[len(cks)-1].State == "protected", fmt.Sprintf("checkpoint %d %s, want protected", i, cks[len(cks)-1].State)
		})
		time.Sleep(5 * time.Second)
	}

	raw := c.OK("report", "ring", "--json")
	var r coordv1.Report
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatalf("%v\n%s", err, raw)
	}
	var keys struct{ Model map[string]any }
	if err := json.Unmarshal([]byte(raw), &keys); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"t_comp", "alpha", "t_coord", "t_write", "t_cont"} {
		if _, ok := keys.Model[k]; !ok {
			t.Errorf("the report's model has no %q", k)
		}
	}
	m := r.Model
	t.Logf("run %.3f s = t_comp %.3f + α %.3f (± %.3f) · t_comm %.3f + %d·(t_coord %.4f + t_write %.4f + t_cont %.4f) + t_after %.3f = %.3f; residual %+.3f s, tolerance %.3f s (rate %.0f/s, noise %.1f%%, %d reports); overhead %.2f%%",
		m.Run, m.TComp, m.Alpha, progressOf(m).AlphaErr, m.TComm, m.N, m.TCoord, m.TWrite, m.TCont, m.TAfter, m.Total, m.Residual, m.Tolerance,
		progressOf(m).Rate, 100*progressOf(m).Noise, progressOf(m).Samples, m.OverheadPct)
	if len(r.Ckpts) != 3 || m.N != 3 {
		t.Fatalf("%d checkpoints, %d in the span; want 3", len(r.Ckpts), m.N)
	}
	if !m.Checked || m.Progress == nil || m.Progress.Samples < 20 {
		t.Fatalf("the report measured nothing from the job's progress: %+v", m)
	}

	// What the report's terms are measured against, read apart from it:
	// the event stream (round events timed by the coordinator, progress
	// sent by rank 0 from inside its container) and the agents' timing
	// of their dumps in the checkpoint records.
	evs := c.Events()
	var recs []coordv1.Ckpt
	if err := json.Unmarshal([]byte(c.OK("checkpoints", "ring", "--json")), &recs); err != nil {
		t.Fatal(err)
	}
	for _, ck := range r.Ckpts {
		t.Logf("checkpoint %d: stall %.3f = t_coord %.4f + t_write %.4f + t_cont %.4f; t_after %.3f, t_copy %.3f, cost %.3f; copied %d B in %.3f s",
			ck.Seq, ck.Stall, ck.TCoord, ck.TWrite, ck.TCont, ck.TAfter, ck.TCopy, ck.Cost, ck.CopyBytes, ck.CopyTime)
		if ck.TWrite <= 0 || ck.TCoord < 0 || ck.TCont < 0 {
			t.Errorf("checkpoint %d: t_coord %v, t_write %v, t_cont %v of a stall of %v: want t_coord + t_cont below the stall", ck.Seq, ck.TCoord, ck.TWrite, ck.TCont, ck.Stall)
		}
		checkStall(t, ck, evs, recs)
	}
	checkSpan(t, r, evs)

	// The terms follow the report's formula (docs/planning.md): its
	// arithmetic, true by construction; the measurement is the residual
	// below.
	sum := m.TComp + m.Alpha*m.TComm + float64(m.N)*(m.TCoord+m.TWrite+m.TCont) + m.TAfter + m.TOther
	if math.Abs(sum-m.Total) > 1e-6 {
		t.Errorf("the terms sum to %v, t_total %v", sum, m.Total)
	}
	if math.Abs(m.Run-m.Total) > m.Tolerance || !m.Within {
		t.Errorf("run time %.3f s, terms %.3f s: residual %+.3f s beyond the noise %.3f s", m.Run, m.Total, m.Run-m.Total, m.Tolerance)
	}
	if m.Tolerance > 0.25*m.Run || m.TComp < 0.5*m.Run || m.Alpha <= 0 {
		t.Errorf("tolerance %.3f s of a %.3f s run, t_comp %.3f s, α %v: not a measurement", m.Tolerance, m.Run, m.TComp, m.Alpha)
	}
	if r.Replication.Copies < 12 || r.Replication.Bytes <= 0 {
		t.Errorf("replication %+v: want 4 copies a checkpoint", r.Replication)
	}
	// 4 nodes, each rank's image on its node and the next: any one
	// failure is survived, two only if not neighbours (2 of 6 pairs),
	// three never.
	want := []float64{1, 1.0 / 3, 0}
	if len(r.Restart) != 3 {
		t.Fatalf("restart odds %+v, want 3", r.Restart)
	}
	for i, o := range r.Restart {
		if o.Failures != i+1 || o.Copies == nil || o.Plan == nil || math.Abs(*o.Copies-want[i]) > 1e-9 || math.Abs(*o.Plan-want[i]) > 1e-9 {
			t.Errorf("after %d failures: %+v, want %v by the copies and by cairn plan", i+1, o, want[i])
		}
	}
	if out := c.OK("report", "ring"); !strings.Contains(out, "t_total") || !strings.Contains(out, "within the noise") {
		t.Errorf("cairn report:\n%s", out)
	}
}

func progressOf(m coordv1.Overhead) coordv1.Progress {
	if m.Progress == nil {
		return coordv1.Progress{}
	}
	return *m.Progress
}

// checkStall checks a checkpoint's stall in the report against what
// measured it apart: the coordinator published checkpoint.prepared once
// every rank had dumped and checkpoint.committed once its decision was
// written, with how long after the round began; the commit, which thaws
// the ranks, goes out right after. So the stall is the committed event's
// duration, it ends when that event was published, and the prepared
// event falls in it. Each rank's agent timed its dump, which the stall
// covers. The records' times may be off by model.ClockNoise.
func checkStall(t *testing.T, ck coordv1.CkptTerms, evs []evv1.Event, recs []coordv1.Ckpt) {
	t.Helper()
	const noise = model.ClockNoise
	var prepared, committed *evv1.Event
	for i, e := range evs {
		if e.Job != "ring" || e.Ckpt != ck.Seq {
			continue
		}
		switch e.Type {
		case evv1.CkptPrepared:
			prepared = &evs[i]
		case evv1.CkptCommitted:
			committed = &evs[i]
		}
	}
	if prepared == nil || committed == nil {
		t.Errorf("checkpoint %d: no checkpoint.prepared or checkpoint.committed event", ck.Seq)
		return
	}
	stall := time.Duration(ck.Stall * float64(time.Second))
	thaw := ck.Start.Add(stall)
	t.Logf("checkpoint %d: stall %s; committed after %s; prepared at %s, committed at %s of the stall (%s)",
		ck.Seq, stall, committed.Duration, prepared.Time.Sub(ck.Start), committed.Time.Sub(ck.Start), stall)
	if d := stall - committed.Duration; d.Abs() > noise {
		t.Errorf("checkpoint %d: stall %s, but checkpoint.committed came %s after the round began", ck.Seq, stall, committed.Duration)
	}
	// The events fall in the recorded window. The round's own clock
	// starts once its record is written: a moment (an etcd write, longer
	// under load) after the record's creation time, which the report's
	// window starts from.
	lag := committed.Time.Add(-committed.Duration).Sub(ck.Start)
	if prepared.Time.Before(ck.Start) || committed.Time.Before(prepared.Time) || lag < -noise || lag > time.Second {
		t.Errorf("checkpoint %d: stall %s..%s, but checkpoint.prepared at %s and checkpoint.committed at %s (the round's clock %s after the record's)",
			ck.Seq, ck.Start.Format(time.StampMicro), thaw.Format(time.StampMicro), prepared.Time.Format(time.StampMicro), committed.Time.Format(time.StampMicro), lag)
	}
	for _, rec := range recs {
		if rec.Seq != ck.Seq {
			continue
		}
		for _, rk := range rec.Ranks {
			if rk.Dump <= 0 || rk.Dump > stall {
				t.Errorf("checkpoint %d: stall %s, rank %d's agent took %s to dump it", ck.Seq, stall, rk.Rank, rk.Dump)
			}
		}
		return
	}
	t.Errorf("checkpoint %d: no record", ck.Seq)
}

// checkSpan checks the report's run against rank 0's progress as the
// event stream has it: the run begins at its first report and ends at
// one of them, no earlier than the last one before the report was made,
// and the work done is what the reports in between count.
func checkSpan(t *testing.T, r coordv1.Report, evs []evv1.Event) {
	t.Helper()
	m := r.Model
	var progress []evv1.Event
	for _, e := range evs {
		if e.Job == "ring" && e.Type == evv1.RankEvent && e.Kind == rankv1.KindProgress && e.Rank != nil && *e.Rank == 0 {
			progress = append(progress, e)
		}
	}
	last := -1
	for i, e := range progress {
		if !e.Time.After(r.At) {
			last = i
		}
	}
	end := slices.IndexFunc(progress, func(e evv1.Event) bool { return e.Time.Equal(m.To) })
	if last < 0 || end < last {
		t.Errorf("the report's run ends at %s; rank 0's last report before the report (at %s) is #%d of %d", m.To, r.At, last, len(progress))
		return
	}
	count := func(e evv1.Event) float64 {
		n, err := strconv.ParseFloat(e.Message, 64)
		if err != nil {
			t.Fatalf("progress event %+v: %v", e, err)
		}
		return n
	}
	first := progress[0]
	units := count(progress[end]) - count(first)
	run := progress[end].Time.Sub(first.Time).Seconds()
	if !m.From.Equal(first.Time) || math.Abs(m.Run-run) > 1e-6 || m.Progress.Samples != end+1 || m.Progress.Units != units {
		t.Errorf("the report's run: %.3f s from %s, %d reports, %v units; rank 0's reports: %.3f s from %s, %d, %v units",
			m.Run, m.From, m.Progress.Samples, m.Progress.Units, run, first.Time, end+1, units)
	}
}
