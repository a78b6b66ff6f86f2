package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The speed targets' table in docs/benchmarks.md is written by the
// benchmarks, never by hand: with CAIRN_BENCH_DOC naming that file (make
// bench sets it), each benchmark that measures a figure of the table
// replaces that figure's row between the markers targetsBegin and
// targetsEnd. A row keeps the figure's previous measurement beside the
// new one, so the table shows two runs; figures a run does not measure
// keep their row as it was.

const (
	targetsBegin = "<!-- bench:targets begin (written by the benchmarks: make bench) -->"
	targetsEnd   = "<!-- bench:targets end -->"
	targetsHead  = "| figure | target | this run | run before | |\n|---|---|---|---|---|"
)

var docMu sync.Mutex

// figure is one measured row of the targets' table: key names it (the
// table's first column), target is the bound as text (e.g. "≤ 1.2"),
// value the ratio measured, met whether it meets the target, and detail
// the numbers the ratio comes from.
type figure struct {
	key, target string
	value       float64
	met         bool
	detail      string
}

// atMost and atLeast make a figure of a ratio against a bound.
func atMost(key string, value, bound float64, detail string) figure {
	return figure{key: key, target: "≤ " + strconv.FormatFloat(bound, 'f', -1, 64), value: value, met: value <= bound, detail: detail}
}

func atLeast(key string, value, bound float64, detail string) figure {
	return figure{key: key, target: "≥ " + strconv.FormatFloat(bound, 'f', -1, 64), value: value, met: value >= bound, detail: detail}
}

// record logs each figure and, with CAIRN_BENCH_DOC set, writes its row
// into the targets' table there.
func record(b *testing.B, figs ...figure) {
	b.Helper()
	for _, f := range figs {
		b.Logf("target %s: %.2f (%s): %s", f.key, f.value, f.target, map[bool]string{true: "met", false: "NOT met"}[f.met])
	}
	path := os.Getenv("CAIRN_BENCH_DOC")
	if path == "" {
		return
	}
	docMu.Lock()
	defer docMu.Unlock()
	doc, err := os.ReadFile(path)
	if err != nil {
		b.Fatalf("CAIRN_BENCH_DOC: %v", err)
	}
	out, err := withFigures(string(doc), time.Now(), figs)
	if err != nil {
		b.Fatalf("%s: %v", path, err)
	}
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		b.Fatal(err)
	}
}

// withFigures returns doc with the rows of figs replaced (or added) in its
// targets' table, each row's last measurement moved to "run before".
func withFigures(doc string, now time.Time, figs []figure) (string, error) {
	i, j := strings.Index(doc, targetsBegin), strings.Index(doc, targetsEnd)
	if i < 0 || j < i {
		return "", fmt.Errorf("no targets' table (%q ... %q)", targetsBegin, targetsEnd)
	}
	body := doc[i+len(targetsBegin) : j]
	var keys []string
	rows := map[string][]string{}
	for _, l := range strings.Split(body, "\n") {
		cells := rowCells(l)
		if len(cells) != 5 || cells[0] == "figure" || strings.HasPrefix(cells[0], "---") {
			continue
		}
		keys = append(keys, cells[0])
		rows[cells[0]] = cells
	}
	day := now.UTC().Format("2006-01-02")
	for _, f := range figs {
		old, ok := rows[f.key]
		if !ok {
			keys = append(keys, f.key)
			old = []string{f.key, f.target, "", "", ""}
		}
		mark := "met"
		if !f.met {
			mark = "**not met**"
		}
		rows[f.key] = []string{f.key, f.target, fmt.Sprintf("%.2f (%s, %s)", f.value, f.detail, day), old[2], mark}
	}
	var sb strings.Builder
	sb.WriteString("\n" + targetsHead + "\n")
	for _, k := range keys {
		sb.WriteString("| " + strings.Join(rows[k], " | ") + " |\n")
	}
	return doc[:i+len(targetsBegin)] + sb.String() + doc[j:], nil
}

// rowCells splits a markdown table row into its cells, trimmed.
func rowCells(l string) []string {
	l = strings.TrimSpace(l)
	if !strings.HasPrefix(l, "|") || !strings.HasSuffix(l, "|") {
		return nil
	}
	cells := strings.Split(l[1:len(l)-1], "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

// TestWithFigures: a figure's row is replaced, its last measurement moved
// beside it; a new figure is added; other rows and the rest of the
// document stay as they were; a document without the table is refused.
func TestWithFigures(t *testing.T) {
	doc := "intro\n" + targetsBegin + "\n" + targetsHead + "\n| a | ≤ 1 | 0.90 (x, 2026-01-01) | 0.80 (y, 2025-12-01) | met |\n| b | ≥ 2 | 3.00 (z, 2026-01-01) | | met |\n" + targetsEnd + "\nrest\n"
	now := time.Date(2026, 2, 3, 0, 0, 0, 0, time.UTC)
	out, err := withFigures(doc, now, []figure{atMost("a", 1.5, 1, "p / q"), atLeast("c", 0.5, 0.8, "r")})
	if err != nil {
		t.Fatal(err)
	}
	want := "intro\n" + targetsBegin + "\n" + targetsHead + "\n| a | ≤ 1 | 1.50 (p / q, 2026-02-03) | 0.90 (x, 2026-01-01) | **not met** |\n| b | ≥ 2 | 3.00 (z, 2026-01-01) |  | met |\n| c | ≥ 0.8 | 0.50 (r, 2026-02-03) |  | **not met** |\n" + targetsEnd + "\nrest\n"
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	if _, err := withFigures("no table", now, nil); err == nil {
		t.Fatal("a document without the table was taken")
	}
	// A bound is written as given: 1.02 was once printed "≤ 1".
	for bound, want := range map[float64]string{1.02: "≤ 1.02", 1.3: "≤ 1.3", 2: "≤ 2"} {
		if got := atMost("x", 1, bound, "").target; got != want {
			t.Errorf("target of bound %v: %q, want %q", bound, got, want)
		}
	}
}
