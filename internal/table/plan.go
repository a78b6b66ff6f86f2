package table

import (
	"fmt"
	"io"

	"github.com/cairn-hpc/cairn/internal/plan"
)

// Plan writes the answers to a planning question (cairn plan): the
// failures each placement survives, with the question's failures the
// probability of a restart, and with its target the replicas needed.
func Plan(w io.Writer, q plan.Query, rows []plan.Row) error {
	fmt.Fprintf(w, "%d nodes, %d replica(s) of every node's images\n\n", q.Nodes, q.Replicas)
	tw := New(w)
	head := "PLACEMENT\tSURVIVES (90%)\t(99%)\t(99.9%)"
	if q.Failures != nil {
		head += fmt.Sprintf("\tP(restart | %d failures)", *q.Failures)
		if q.Trials > 0 {
			head += "\tMONTE CARLO (99.9% CI)"
		}
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		line := fmt.Sprintf("%s\t%d failures\t%d\t%d", r.Placement, r.Tolerable["90%"], r.Tolerable["99%"], r.Tolerable["99.9%"])
		if r.P != nil {
			line += fmt.Sprintf("\t%.6f", *r.P)
			if r.MonteCarlo != nil {
				line += fmt.Sprintf("\t%.6f [%.6f, %.6f]", r.MonteCarlo.P, r.MonteCarlo.Low, r.MonteCarlo.High)
			}
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if q.Target > 0 && q.Failures != nil {
		f := *q.Failures
		fmt.Fprintln(w)
		for _, r := range rows {
			if r.Needed == nil {
				fmt.Fprintf(w, "%s: no replica count survives %d failures of %d nodes\n", r.Placement, f, q.Nodes)
				continue
			}
			fmt.Fprintf(w, "%s: %d replica(s) survive %d failures with P = %.6f >= %g\n", r.Placement, *r.Needed, f, r.NeededP, q.Target)
		}
	}
	return nil
}
