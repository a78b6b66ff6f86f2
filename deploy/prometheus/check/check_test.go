package check

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

var (
	rulesFile = filepath.Join("..", "cairn-rules.yml")
	dashFile  = filepath.Join("..", "..", "grafana", "cairn.json")
	opsFile   = filepath.Join("..", "..", "..", "docs", "operations.md")
	promql    = parser.NewParser(parser.Options{})
)

// runbookBase is where the rules say an alert's runbook is: the operators'
// guide as a package installs it.
const runbookBase = "file:///usr/share/doc/cairn/operations.md#"

// TestRules reads the rules file as Prometheus loads it: unknown fields,
// bad durations, unparsable or ill-typed expressions and bad templates
// are errors. Every alert must give a vector, or it can never fire, and
// have a runbook: a section of docs/operations.md named after it.
func TestRules(t *testing.T) {
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		return
	}
	ops, err := os.ReadFile(opsFile)
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, line := range strings.Split(string(ops), "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			headings[strings.ToLower(strings.TrimSpace(h))] = true
		}
	}
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			n++
			// Its runbook: a section of docs/operations.md named after it.
			url := r.Annotations["runbook_url"]
			if anchor, ok := strings.CutPrefix(url, runbookBase); !ok || anchor != strings.ToLower(r.Alert) || !headings[anchor] {
				t.Errorf("alert %s: runbook_url %q, want %s%s, a section (### %s) of docs/operations.md", r.Alert, url, runbookBase, strings.ToLower(r.Alert), r.Alert)
			}
			expr, err := promql.ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
				continue
			}
			if ty := expr.Type(); ty != parser.ValueTypeVector {
				t.Errorf("alert %s: its expression gives a %s, not a vector", r.Alert, ty)
			}
			if r.For != 0 && time.Duration(r.For) < time.Minute {
				t.Errorf("alert %s: for %s is shorter than a few scrapes", r.Alert, r.For)
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules read")
	}
}

// grafana replaces the dashboard's variables as Grafana does before it
// sends a query: the interval by a duration, a multi-value variable in a
// regex matcher by an alternation.
var grafana = strings.NewReplacer(
	"$__rate_interval", "1m",
	"$__interval", "1m",
	"$__range", "1h",
	"$job_name", "a|b",
	"$node", "a|b",
)

// TestDashboard parses every query of the Grafana dashboard, and its
// variables' label_values() selectors, with the PromQL parser.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(dashFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
		Panels []panel `json:"panels"`
	}
	var dash struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	n := 0
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				n++
				q := grafana.Replace(tg.Expr)
				if strings.Contains(q, "$") {
					t.Errorf("panel %q %s: a variable the dashboard does not define: %s", p.Title, tg.RefID, tg.Expr)
					continue
				}
				if _, err := promql.ParseExpr(q); err != nil {
					t.Errorf("panel %q %s: %v\n\t%s", p.Title, tg.RefID, err, tg.Expr)
				}
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	if n == 0 {
		t.Fatal("no dashboard queries read")
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
			continue
		}
		sel, ok := strings.CutPrefix(q.Query, "label_values(")
		sel, _, found := strings.Cut(sel, ",")
		if !ok || !found {
			t.Errorf("variable %s: want label_values(SELECTOR, LABEL), have %q", v.Name, q.Query)
			continue
		}
		if _, err := promql.ParseMetricSelector(sel); err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
		}
	}
}
