package chaos_test

import (
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/chaos"
)

// TestReport: the text and the markdown say the figures measured and
// predicted, the failures, and whether the result was exact.
func TestReport(t *testing.T) {
	res := chaos.Result{Job: "chaos", Ranks: 2, Nodes: 2, ClusterNodes: 5, Replicas: 2, Messages: 1000, Seed: 3,
		NodeMTBF: 100 * time.Second, JobMTBF: 50 * time.Second, Repair: 20 * time.Second,
		Measurement: chaos.Measurement{Wall: 600, Work: 400, Rate: 1, Useful: 400, ETTR: 0.6667, Predicted: 0.7,
			Failures: 25, Hits: 12, Restarts: 12, MTBF: 50, Cost: 0.9, Rounds: 40, Interval: 10.5, Intervals: 35,
			Restart: 8.25, RestartsTimed: 10, RestartTook: 2.5, Lost: 4.5},
		Output: "00ff", Expected: "00ff", Exact: true}
	var text strings.Builder
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	md := res.Markdown()
	for _, want := range []string{"0.667", "0.700", "-3.3 points", "25, 12 of them", "0.90 s", "8.25 s", "50.00 s", "exact"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	res.Exact, res.Output = false, "0100"
	if md := res.Markdown(); !strings.Contains(md, "WRONG: 0100, expected 00ff") {
		t.Errorf("a wrong result:\n%s", md)
	}
}
