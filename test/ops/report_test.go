package ops

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	coordv1 "cairn/api/coord/v1"
	"cairn/internal/testutil"
)

// TestReport is `cairn report` on the ring job with one replica after
// three checkpoints: the measured terms of its run time add up to the run
// time measured (the span of its progress reports), within the noise the
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
	for _, ck := range r.Ckpts {
		t.Logf("checkpoint %d: stall %.3f = t_coord %.4f + t_write %.4f + t_cont %.4f; t_after %.3f, t_copy %.3f, cost %.3f; copied %d B in %.3f s",
			ck.Seq, ck.Stall, ck.TCoord, ck.TWrite, ck.TCont, ck.TAfter, ck.TCopy, ck.Cost, ck.CopyBytes, ck.CopyTime)
		if math.Abs(ck.TCoord+ck.TWrite+ck.TCont-ck.Stall) > 1e-6 || ck.TWrite <= 0 {
			t.Errorf("checkpoint %d: t_coord + t_write + t_cont = %v, stall %v", ck.Seq, ck.TCoord+ck.TWrite+ck.TCont, ck.Stall)
		}
	}
	if len(r.Ckpts) != 3 || m.N != 3 {
		t.Fatalf("%d checkpoints, %d in the span; want 3", len(r.Ckpts), m.N)
	}
	if !m.Checked || m.Progress == nil || m.Progress.Samples < 20 {
		t.Fatalf("the report measured nothing from the job's progress: %+v", m)
	}
	sum := m.TComp + m.Alpha*m.TComm + float64(m.N)*(m.TCoord+m.TWrite+m.TCont) + m.TAfter + m.TOther
	if math.Abs(sum-m.Total) > 1e-6 || math.Abs(m.To.Sub(m.From).Seconds()-m.Run) > 1e-6 {
		t.Errorf("the terms sum to %v, t_total %v; run %v over %s..%s", sum, m.Total, m.Run, m.From, m.To)
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
