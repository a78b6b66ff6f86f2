package table

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// New returns a writer that aligns tab-separated columns, two spaces
// apart; Flush writes them.
func New(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// pid is a process id, or "-" for none.
func pid(pid int) string {
	if pid == 0 {
		return "-"
	}
	return fmt.Sprint(pid)
}

// truncate shortens s to n bytes, the last an ellipsis.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// nodeSet lists the distinct nodes of a placement in order.
func nodeSet(placement []string) string {
	var out []string
	seen := map[string]bool{}
	for _, n := range placement {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return strings.Join(out, ",")
}
