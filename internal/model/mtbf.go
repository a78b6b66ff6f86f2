package model

import (
	"fmt"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
)

// MinFailures is how many node failures the cluster must have seen
// before its estimate of a node's MTBF is used. The estimate of r
// failures has a relative standard error of about 1/sqrt(r): ±45% at 5;
// the interval, which goes with sqrt(M), is then within about ±22%, which
// costs at most a few percent of the overhead (the cost near the optimum
// grows with the square of the error).
const MinFailures = 5

// Failures is what the cluster has seen of its nodes: node-time observed
// alive (Exposure, since Since) and node failures (Count).
type Failures struct {
	Since    time.Time     `json:"since"`
	Exposure time.Duration `json:"exposure_ns"`
	Count    int           `json:"count"`
}

// Estimate is a node's MTBF as the failures show it: the maximum-
// likelihood estimate for exponential lifetimes, the node-time observed
// over the failures seen; trusted once there are MinFailures of them.
func (f Failures) Estimate() (mtbf time.Duration, trusted bool) {
	if f.Count == 0 {
		return 0, false
	}
	return f.Exposure / time.Duration(f.Count), f.Count >= MinFailures
}

// MTBF picks the MTBF of a node of a job on nodes nodes: the job's own
// (job, its --mtbf) first, then the cluster's estimate once trusted, then
// the coordinator's (its --mtbf). Node is 0 when none is known.
func MTBF(job, coordinator time.Duration, f Failures, nodes int) coordv1.MTBF {
	est, trusted := f.Estimate()
	m := coordv1.MTBF{Estimate: est, Failures: f.Count, Exposure: f.Exposure, Since: f.Since, Trusted: trusted}
	switch {
	case job > 0:
		m.Node, m.Source = job, "job"
	case trusted:
		m.Node, m.Source = est, "estimate"
	case coordinator > 0:
		m.Node, m.Source = coordinator, "coordinator"
	}
	if m.Node > 0 {
		m.Job = JobMTBF(m.Node, nodes)
	}
	return m
}

// Basis says where an MTBF comes from, in words.
func Basis(m coordv1.MTBF, nodes int) string {
	var src string
	switch m.Source {
	case "job":
		src = "the job's --mtbf"
	case "estimate":
		src = fmt.Sprintf("estimated from %d node failures in %s of node time", m.Failures, round(m.Exposure))
	case "coordinator":
		src = "the coordinator's --mtbf"
		if m.Failures > 0 {
			src += fmt.Sprintf(" (%d node failures seen, %d needed for an estimate)", m.Failures, MinFailures)
		}
	default:
		return "no MTBF known"
	}
	return fmt.Sprintf("a node's MTBF %s (%s) over the job's %d nodes", round(m.Node), src, max(nodes, 1))
}
