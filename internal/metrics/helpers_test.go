package metrics_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
)

// series gathers g and returns every series' value by its name and
// labels, as the text format writes them (name{a="x",b="y"}, labels in
// order); a histogram gives its _count and _sum.
func series(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(ls)
			key := func(name string) string {
				if len(ls) == 0 {
					return name
				}
				return name + "{" + strings.Join(ls, ",") + "}"
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[key(mf.GetName())] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key(mf.GetName())] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key(mf.GetName()+"_count")] = float64(m.GetHistogram().GetSampleCount())
				out[key(mf.GetName()+"_sum")] = m.GetHistogram().GetSampleSum()
			case dto.MetricType_UNTYPED:
				out[key(mf.GetName())] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

// want checks that got has every series of want with its value, within
// a millionth, and none of absent.
func want(t *testing.T, got map[string]float64, want map[string]float64, absent ...string) {
	t.Helper()
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, ok := got[k]
		switch {
		case !ok:
			t.Errorf("no series %s", k)
		case v-want[k] > 1e-6 || want[k]-v > 1e-6:
			t.Errorf("%s = %v, want %v", k, v, want[k])
		}
	}
	for _, k := range absent {
		if _, ok := got[k]; ok {
			t.Errorf("series %s, want none", k)
		}
	}
}

// lint fails t with every problem promlint finds in what g gathers.
func lint(t *testing.T, g prometheus.Gatherer) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// evDurable is a live checkpoint.durable event.
func evDurable(job string, seq int, bytes int64) evv1.Event {
	return evv1.Event{Type: evv1.CkptDurable, Job: job, Ckpt: seq, Time: t0, Bytes: bytes}
}

// certs is a CertExpiry for registries that expose every family.
func certs() (node, ca time.Time) {
	now := time.Now()
	return now.Add(365 * 24 * time.Hour), now.Add(10 * 365 * 24 * time.Hour)
}
