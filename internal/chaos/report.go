package chaos

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Points is how far the measured ETTR is from the predicted one, in
// percentage points (measured − predicted).
func (m Measurement) Points() float64 { return 100 * (m.ETTR - m.Predicted) }

// WriteText writes the result as the CLI shows it.
func (r Result) WriteText(w io.Writer) error {
	m := r.Measurement
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("ETTR", "measured %.3f, predicted %.3f (%+.1f points)", m.ETTR, m.Predicted, m.Points())
	row("  useful time", "%.1f s of %.1f s: %.0f messages at the job's undisturbed rate, %.0f/s", m.Useful, m.Wall, m.Work, m.Rate)
	row("failures", "%s", failures(m))
	row("job MTBF M", "%s measured (%s drawn: a node's %s over %d nodes)", secs(m.MTBF), r.JobMTBF, r.NodeMTBF, r.Nodes)
	row("checkpoint cost C", "%s (mean of %d rounds)", secs(m.Cost), m.Rounds)
	row("interval τ+C", "%s (mean of %d)%s", secs(m.Interval), m.Intervals, r.chosen())
	row("restart time R", "%s (mean of %d restarts after one failure; the restarts themselves took %s)%s", secs(m.Restart), m.RestartsTimed, secs(m.RestartTook), compound(m))
	row("work lost", "%s per restart", secs(m.Lost))
	row("wall time", "%.1f s: useful %.1f, checkpoints %.1f, work lost %.1f, down %.1f, other %.1f", m.Wall, m.Useful, m.Ckpts, m.LostTime, m.Down, m.Other)
	exact := "exact (ringapp.Expected)"
	if !r.Exact {
		exact = "WRONG: expected " + r.Expected
	}
	row("result", "%s: %s", r.Output, exact)
	for _, n := range m.Notes {
		row("note", "%s", n)
	}
	return tw.Flush()
}

// chosen says the coordinator's last interval, if known.
func (r Result) chosen() string {
	if r.Interval == nil {
		return ""
	}
	return fmt.Sprintf("; the coordinator's last choice: every %s for C %s", r.Interval.Every.Round(10*time.Millisecond), r.Interval.Cost.Round(10*time.Millisecond))
}

// Markdown is the result as a table for docs/planning.md.
func (r Result) Markdown() string {
	m := r.Measurement
	var b strings.Builder
	row := func(k, format string, args ...any) { fmt.Fprintf(&b, "| %s | %s |\n", k, fmt.Sprintf(format, args...)) }
	b.WriteString("| | |\n|---|---|\n")
	loses := ""
	if r.LoseData {
		loses = ", with its disk"
	}
	row("run", "%d nodes; the ring job, %d ranks (one a node), %d messages, checkpoints auto, %d replica(s); seed %d",
		r.ClusterNodes, r.Ranks, r.Messages, r.Replicas, r.Seed)
	row("failures drawn", "every node: a node's MTBF %s (the job's %s), back %s after it fails%s", r.NodeMTBF, r.JobMTBF, r.Repair, loses)
	row("duration (window)", "%.1f s", m.Wall)
	row("failures", "%s", failures(m))
	row("**ETTR measured**", "**%.3f** (useful %.1f s: %.0f messages at %.0f/s)", m.ETTR, m.Useful, m.Work, m.Rate)
	row("**ETTR predicted**", "**%.3f** (measured − predicted: %+.1f points)", m.Predicted, m.Points())
	row("checkpoint cost C", "%s (mean of %d rounds)", secs(m.Cost), m.Rounds)
	row("interval τ + C", "%s (mean of %d)", secs(m.Interval), m.Intervals)
	row("restart time R", "%s (mean of %d restarts after one failure; the restarts themselves %s)%s", secs(m.Restart), m.RestartsTimed, secs(m.RestartTook), compound(m))
	row("job MTBF M", "%s measured (the window over the job's interruptions)", secs(m.MTBF))
	row("work lost", "%s per restart", secs(m.Lost))
	row("wall time", "useful %.1f s, checkpoints %.1f s, work lost %.1f s, down %.1f s, other %.1f s", m.Useful, m.Ckpts, m.LostTime, m.Down, m.Other)
	exact := "exact: " + r.Output + ", as ringapp.Expected computes it"
	if !r.Exact {
		exact = fmt.Sprintf("WRONG: %s, expected %s", r.Output, r.Expected)
	}
	row("result", "%s", exact)
	return b.String()
}

// failures says the failures and restarts.
func failures(m Measurement) string {
	s := fmt.Sprintf("%d, %d of them of the job's nodes; %d restarts", m.Failures, m.Hits, m.Restarts)
	if m.Unexplained > 0 {
		s += fmt.Sprintf(", %d of them after no failure injected (a live node found dead)", m.Unexplained)
	}
	return s
}

// compound says the restarts after several failures, if any.
func compound(m Measurement) string {
	if m.Compound == 0 {
		return ""
	}
	return fmt.Sprintf("; %d restarts after several failures took %s each", m.Compound, secs(m.CompoundDown))
}

// secs writes seconds for people.
func secs(s float64) string {
	if s >= 100 {
		return fmt.Sprintf("%.0f s", s)
	}
	return fmt.Sprintf("%.2f s", s)
}
