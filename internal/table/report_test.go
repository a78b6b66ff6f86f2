package table_test

import (
	"strings"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/table"
)

func TestReport(t *testing.T) {
	one, third, zero := 1.0, 1.0/3, 0.0
	from := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	r := coordv1.Report{Job: "ring", State: "running", Ranks: 4, Nodes: 4, Replicas: 1, Every: 7 * time.Second,
		Ckpts: []coordv1.CkptTerms{{Seq: 1, State: "protected", Stall: 0.43, TCoord: 0.0127, TWrite: 0.2212, TCont: 0.196,
			TAfter: 0.454, TCopy: 0.224, Cost: 1.107, Ingest: 0.3, Bytes: 17 << 20, CopyBytes: 3942312, CopyTime: 0.36}},
		Model: coordv1.Overhead{From: from, To: from.Add(23 * time.Second), Run: 23.195, TComp: 21.175, TComm: 0.25, Alpha: 2.642, N: 3,
			TCoord: 0.0082, TWrite: 0.2282, TCont: 0.0988, TAfter: 0.77, Total: 23.61, Residual: -0.415, Tolerance: 1.434,
			Checked: true, Within: true, OverheadPct: 10.2, AlphaBasis: "rank 0's progress rate",
			Progress: &coordv1.Progress{Rank: 0, Samples: 46, Rate: 50502, Noise: 0.163, AlphaErr: 2.565}},
		Replication: coordv1.Replication{Copies: 12, Bytes: 8 << 20, Time: 0.66},
		Interval: &coordv1.Interval{Every: 7 * time.Second, Tau: 6300 * time.Millisecond, Young: 7500 * time.Millisecond, Cost: 700 * time.Millisecond,
			CostBasis: "median of the last 3 durable rounds' stall", MTBF: 30 * time.Second, MTBFBasis: "a node's MTBF 2m0s (the job's --mtbf) over the job's 4 nodes", Formula: "daly"},
		MTBF:    coordv1.MTBF{Node: 2 * time.Minute, Job: 30 * time.Second, Source: "job"},
		Restart: []coordv1.RestartOdds{{Failures: 1, Copies: &one, Plan: &one}, {Failures: 2, Copies: &third, Plan: &third}, {Failures: 3, Copies: &zero}},
	}
	var b strings.Builder
	if err := table.Report(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"job ring (running): 4 ranks on 4 nodes, 1 replica(s); periodic checkpoints: every 7s (auto)",
		"1     protected  430ms  12.7ms   221.2ms  196ms   454ms    224ms   1.11s  300ms   17.0 MiB  3.8 MiB in 360ms",
		"over the span of rank 0's 46 progress reports",
		"  α         2.642 ± 2.565  (rank 0's progress rate)",
		"  t_write   0.228 s per checkpoint, 0.685 s in all",
		"  residual  -0.415 s, within the noise ±1.434 s",
		"replication: 12 copies, 8.0 MiB, while copies ran 660ms",
		"interval: every 7s = Daly's τ 6.3s + C 700ms (daly; Young's would be 7.5s)",
		"MTBF: a node's 2m0s (job), the job's 30s; 0 node failures seen",
		"2         0.333333                  0.333333",
		"3         0.000000                  -",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}
