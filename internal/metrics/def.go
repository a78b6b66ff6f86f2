package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Def is one metric family: its name, type (counter, gauge or
// histogram), help and variable labels.
type Def struct {
	Name   string
	Type   string
	Help   string
	Labels []string
}

// Families returns the names a family's series are exposed under: a
// histogram's _bucket, _sum and _count, else its own name.
func (d Def) Families() []string {
	if d.Type == "histogram" {
		return []string{d.Name + "_bucket", d.Name + "_sum", d.Name + "_count"}
	}
	return []string{d.Name}
}

// defs registers metric vectors in a registry and keeps their Defs.
type defs struct {
	reg  *prometheus.Registry
	list []Def
}

func (d *defs) add(c prometheus.Collector, def Def) {
	d.reg.MustRegister(c)
	d.list = append(d.list, def)
}

func (d *defs) counter(name, help string, labels ...string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	d.add(v, Def{name, "counter", help, labels})
	return v
}

func (d *defs) gauge(name, help string, labels ...string) *prometheus.GaugeVec {
	v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	d.add(v, Def{name, "gauge", help, labels})
	return v
}

func (d *defs) histogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	d.add(v, Def{name, "histogram", help, labels})
	return v
}

// Buckets of the histograms, in seconds.
var (
	// A round's phases: from 50 ms to about 100 s.
	roundBuckets = prometheus.ExponentialBuckets(0.05, 2, 12)
	// Copies, restarts and migrations: from 100 ms to about 7 min.
	longBuckets = prometheus.ExponentialBuckets(0.1, 2, 13)
)
