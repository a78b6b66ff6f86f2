package chaos_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/chaos"
)

// faults returns the first n faults of a schedule.
func faults(s *chaos.Schedule, n int) []chaos.Fault {
	var out []chaos.Fault
	for range n {
		f, ok := s.Next()
		if !ok {
			break
		}
		out = append(out, f)
	}
	return out
}

// TestScheduleSeeded: a seed gives the same faults every time, in time
// order; another seed gives others; a node's faults do not depend on the
// other nodes (or their order).
func TestScheduleSeeded(t *testing.T) {
	nodes := []string{"n1", "n2", "n3"}
	a := faults(chaos.NewSchedule(7, nodes, time.Minute, 10*time.Second), 200)
	b := faults(chaos.NewSchedule(7, []string{"n3", "n1", "n2"}, time.Minute, 10*time.Second), 200)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("same seed, other faults (-first +second):\n%s", diff)
	}
	for i := 1; i < len(a); i++ {
		if a[i].At < a[i-1].At {
			t.Fatalf("fault %d at %s before fault %d at %s", i, a[i].At, i-1, a[i-1].At)
		}
	}
	if c := faults(chaos.NewSchedule(8, nodes, time.Minute, 10*time.Second), 200); cmp.Equal(a, c) {
		t.Fatal("seeds 7 and 8 give the same faults")
	}
	only := func(fs []chaos.Fault, node string) []chaos.Fault {
		var out []chaos.Fault
		for _, f := range fs {
			if f.Node == node {
				out = append(out, f)
			}
		}
		return out
	}
	d := faults(chaos.NewSchedule(7, []string{"n1", "x9"}, time.Minute, 10*time.Second), 200)
	n1, n1d := only(a, "n1"), only(d, "n1")
	k := min(len(n1), len(n1d))
	if k < 20 {
		t.Fatalf("only %d faults of n1 to compare", k)
	}
	if diff := cmp.Diff(n1[:k], n1d[:k]); diff != "" {
		t.Fatalf("n1's faults changed with the other nodes (-with n2,n3 +with x9):\n%s", diff)
	}
}

// TestScheduleRates: every node fails, then is repaired exactly the
// repair time later, alternately; the times it is up average the MTBF
// and are spread as an exponential's (standard deviation = mean).
func TestScheduleRates(t *testing.T) {
	const mtbf, repair = 100 * time.Second, 7 * time.Second
	nodes := []string{"a", "b", "c", "d"}
	s := chaos.NewSchedule(1, nodes, mtbf, repair)
	last := map[string]chaos.Fault{}
	var ups []float64
	for _, f := range faults(s, 40000) {
		prev, seen := last[f.Node]
		switch {
		case !seen && f.Kind != chaos.Fail:
			t.Fatalf("%s's first fault is a %s", f.Node, f.Kind)
		case seen && prev.Kind == f.Kind:
			t.Fatalf("%s: two %ss in a row at %s and %s", f.Node, f.Kind, prev.At, f.At)
		case f.Kind == chaos.Repair && f.At-prev.At != repair:
			t.Fatalf("%s repaired %s after it failed, want %s", f.Node, f.At-prev.At, repair)
		case f.Kind == chaos.Fail:
			up := f.At
			if seen {
				up -= prev.At
			}
			ups = append(ups, up.Seconds())
		}
		last[f.Node] = f
	}
	if len(last) != len(nodes) {
		t.Fatalf("faults of %d nodes, want %d", len(last), len(nodes))
	}
	var sum, sq float64
	for _, u := range ups {
		sum += u
	}
	mean := sum / float64(len(ups))
	for _, u := range ups {
		sq += (u - mean) * (u - mean)
	}
	sd := math.Sqrt(sq / float64(len(ups)))
	// 20,000 draws: the mean's relative standard error is 0.7%.
	if rel := mean/mtbf.Seconds() - 1; math.Abs(rel) > 0.03 {
		t.Errorf("mean time up %.1fs over %d failures, want %s within 3%%", mean, len(ups), mtbf)
	}
	if rel := sd/mean - 1; math.Abs(rel) > 0.05 {
		t.Errorf("times up spread by %.1fs around %.1fs: not exponential", sd, mean)
	}
}

// TestScheduleEmpty: no nodes, no faults.
func TestScheduleEmpty(t *testing.T) {
	if f, ok := chaos.NewSchedule(1, nil, time.Minute, time.Second).Next(); ok {
		t.Fatalf("a fault without nodes: %+v", f)
	}
}

// TestConfigCheck: what a run cannot be made of is refused as ErrConfig,
// and what is left zero takes the defaults.
func TestConfigCheck(t *testing.T) {
	var cfg chaos.Config
	cfg.Replicas = 1
	if err := cfg.Check(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if cfg.Job != chaos.DefaultJob || cfg.Ranks != chaos.DefaultRanks || cfg.Messages != chaos.DefaultMessages || cfg.MTBF != chaos.DefaultMTBF || cfg.Repair != chaos.DefaultRepair {
		t.Errorf("defaults: %+v", cfg)
	}
	for _, bad := range []chaos.Config{
		{Ranks: 1, Replicas: 1},
		{Replicas: 0},
		{Replicas: 1, MTBF: -time.Second},
		{Replicas: 1, Duration: -time.Second},
		{Replicas: 1, Messages: -1},
	} {
		if err := bad.Check(); !errors.Is(err, chaos.ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", bad, err)
		}
	}
}
