package table

import (
	"fmt"
	"io"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/human"
)

// Report writes a job's report (cairn report): its rounds' terms, the
// model's terms against the run time, replication, interval, MTBF and
// restart odds.
func Report(w io.Writer, r coordv1.Report) error {
	m := r.Model
	every := "none"
	if r.Every > 0 {
		every = "every " + human.Duration(r.Every)
	}
	if r.Interval != nil {
		every += " (auto)"
	}
	fmt.Fprintf(w, "job %s (%s): %s on %s, %d replica(s); periodic checkpoints: %s\n\n",
		r.Job, r.State, human.Plural(r.Ranks, "rank"), human.Plural(r.Nodes, "node"), r.Replicas, every)

	tw := New(w)
	fmt.Fprintln(tw, "CKPT\tSTATE\tSTALL\tT_COORD\tT_WRITE\tT_CONT\tT_AFTER\tT_COPY\tCOST\tINGEST\tSIZE\tCOPIED")
	for _, c := range r.Ckpts {
		copied := "-"
		if c.CopyBytes > 0 {
			copied = human.Bytes(c.CopyBytes) + " in " + secs(c.CopyTime)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Seq, c.State, secs(c.Stall), secs(c.TCoord),
			secs(c.TWrite), secs(c.TCont), secs(c.TAfter), secs(c.TCopy), secs(c.Cost), secs(c.Ingest), human.Bytes(c.Bytes), copied)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	span := "from the job's start"
	if p := m.Progress; p != nil {
		span = fmt.Sprintf("the span of rank %d's %d progress reports", p.Rank, p.Samples)
	}
	fmt.Fprintf(w, "\nt_total = t_comp + α·t_comm + n·(t_coord + t_write + t_cont) + t_after, over %s (%s to %s):\n",
		span, m.From.Local().Format(time.TimeOnly), m.To.Local().Format(time.TimeOnly))
	tw = New(w)
	n := float64(m.N)
	alpha := fmt.Sprintf("%.3f", m.Alpha)
	if p := m.Progress; p != nil && p.AlphaErr > 0 {
		alpha += fmt.Sprintf(" ± %.3f", p.AlphaErr)
	}
	rows := [][2]string{
		{"t_comp", fmt.Sprintf("%.3f s", m.TComp)},
		{"α", alpha + "  (" + m.AlphaBasis + ")"},
		{"t_comm", fmt.Sprintf("%.3f s", m.TComm)},
		{"n", fmt.Sprint(m.N)},
		{"t_coord", fmt.Sprintf("%.3f s per checkpoint, %.3f s in all", m.TCoord, n*m.TCoord)},
		{"t_write", fmt.Sprintf("%.3f s per checkpoint, %.3f s in all", m.TWrite, n*m.TWrite)},
		{"t_cont", fmt.Sprintf("%.3f s per checkpoint, %.3f s in all", m.TCont, n*m.TCont)},
		{"t_after", fmt.Sprintf("%.3f s", m.TAfter)},
	}
	if m.TOther != 0 {
		rows = append(rows, [2]string{"migrations", fmt.Sprintf("%.3f s", m.TOther)})
	}
	rows = append(rows, [2]string{"t_total", fmt.Sprintf("%.3f s", m.Total)}, [2]string{"run time", fmt.Sprintf("%.3f s", m.Run)})
	if m.Checked {
		verdict := "within"
		if !m.Within {
			verdict = "NOT within"
		}
		rows = append(rows, [2]string{"residual", fmt.Sprintf("%+.3f s, %s the noise ±%.3f s (the rate's spread %.0f%%, over the intervals checkpoints touched)",
			m.Residual, verdict, m.Tolerance, 100*m.Progress.Noise)})
	} else {
		rows = append(rows, [2]string{"residual", "0 by construction"})
	}
	rows = append(rows, [2]string{"overhead", fmt.Sprintf("%.2f%% of the job's work", m.OverheadPct)})
	for _, row := range rows {
		fmt.Fprintf(tw, "  %s\t%s\n", row[0], row[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, note := range m.Notes {
		fmt.Fprintf(w, "  note: %s\n", note)
	}

	rp := r.Replication
	copies := fmt.Sprintf("%d copies", rp.Copies)
	if rp.Copies == 1 {
		copies = "1 copy"
	}
	fmt.Fprintf(w, "\nreplication: %s, %s, while copies ran %s\n", copies, human.Bytes(rp.Bytes), secs(rp.Time))
	if iv := r.Interval; iv != nil {
		fmt.Fprintf(w, "interval: every %s = Daly's τ %s + C %s (%s; Young's would be %s)\n  C: %s\n  M %s: %s\n",
			human.Duration(iv.Every), human.Duration(iv.Tau), human.Duration(iv.Cost), iv.Formula, human.Duration(iv.Young),
			iv.CostBasis, human.Duration(iv.MTBF), iv.MTBFBasis)
	}
	mt := r.MTBF
	known := "none known"
	if mt.Node > 0 {
		known = fmt.Sprintf("a node's %s (%s), the job's %s", human.Duration(mt.Node), mt.Source, human.Duration(mt.Job))
	}
	fmt.Fprintf(w, "MTBF: %s; %s seen in %s of node time\n", known, human.Plural(mt.Failures, "node failure"), human.Duration(mt.Exposure))

	fmt.Fprintln(w, "\nrestart after simultaneous random node failures:")
	tw = New(w)
	fmt.Fprintf(tw, "FAILURES\tP (WHERE THE COPIES ARE)\tP (CAIRN PLAN: RING, %s, K=%d)\n", human.Plural(r.Nodes, "node"), r.Replicas)
	for _, o := range r.Restart {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", o.Failures, prob(o.Copies), prob(o.Plan))
	}
	return tw.Flush()
}

// secs is a number of seconds as a duration people read.
func secs(s float64) string {
	if s == 0 {
		return "0"
	}
	return human.Duration(time.Duration(s * float64(time.Second)))
}

func prob(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.6f", *p)
}
