package metrics_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v2"

	_ "github.com/cairn-hpc/cairn/internal/catalog" // the embedded etcd, whose metrics the coordinator serves
	"github.com/cairn-hpc/cairn/internal/metrics"
)

// known returns every family cairn exports, with its labels: the
// coordinator's, an agent's, and what the default registry holds in a
// coordinator's process (etcd's, the Go runtime's, the process's).
func known(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	var defs []metrics.Def
	defs = append(defs, metrics.NewCoord(metrics.CoordOptions{Certs: certs}).Defs()...)
	defs = append(defs, metrics.NewNode(metrics.NodeOptions{Node: "n1", Certs: certs}).Defs()...)
	types := map[string]string{}
	for _, d := range defs {
		for _, f := range d.Families() {
			// Both daemons may export a family (their certificates'
			// expiry), of one type; the agent's has its node label too.
			if typ, dup := types[f]; dup && typ != d.Type {
				t.Errorf("family %s defined as a %s and a %s", f, typ, d.Type)
			}
			types[f] = d.Type
			if len(d.Labels) < len(out[f]) {
				continue
			}
			out[f] = d.Labels
			if strings.HasSuffix(f, "_bucket") {
				out[f] = append(slices.Clone(d.Labels), "le")
			}
		}
	}
	out["up"] = targetLabels // Prometheus's own, of every target it scrapes
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		out[mf.GetName()] = nil // labels unchecked
		out[mf.GetName()+"_bucket"] = nil
		out[mf.GetName()+"_sum"] = nil
		out[mf.GetName()+"_count"] = nil
	}
	if _, ok := out["etcd_server_has_leader"]; !ok {
		t.Fatal("no etcd metrics in the default registry")
	}
	return out
}

// exprs returns the queries of the rules file and the dashboard, each
// with where it is.
func exprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "prometheus", "cairn-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &rules); err != nil {
		t.Fatalf("cairn-rules.yml: %v", err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			where := "rule " + r.Alert
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s (group %s): want an alert name, an expr, a severity, a summary and a description", where, g.Name)
			}
			out[where] = r.Expr
			n++
		}
	}
	if n < 8 {
		t.Errorf("%d rules", n)
	}

	b, err = os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "cairn.json"))
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	}
	type panel struct {
		Title   string   `json:"title"`
		Type    string   `json:"type"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var dash struct {
		Title      string  `json:"title"`
		UID        string  `json:"uid"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("cairn.json: %v", err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Error("the dashboard has no title or uid")
	}
	var walk func([]panel)
	n = 0
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				out["panel "+p.Title+" "+tg.RefID] = tg.Expr
				n++
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	if n < 20 {
		t.Errorf("%d dashboard queries", n)
	}
	for _, v := range dash.Templating.List {
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) == nil && q.Query != "" {
			out["variable "+v.Name] = q.Query
		}
	}
	return out
}

var (
	stringRE    = regexp.MustCompile(`"(\\.|[^"\\])*"|'(\\.|[^'\\])*'|` + "`[^`]*`")
	nameRE      = regexp.MustCompile(`\b(cairn|etcd|go|process)_[a-zA-Z0-9_:]*|\bup\b`)
	scrapeJobRE = regexp.MustCompile(`\bup\{job="([^"]*)"`)
	selectorRE  = regexp.MustCompile(`\b((?:cairn|etcd)_[a-zA-Z0-9_:]*)\{([^}]*)\}`)
	matcherRE   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	groupingRE  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
)

// targetLabels are the labels Prometheus gives every scraped series.
var targetLabels = []string{"job", "instance"}

// TestDeployNamesMetrics: every metric the dashboard's and the rules'
// queries name exists, with the labels they match or group on; a scrape
// job an alert names (up{job="..."}) is one deploy/README.md configures.
func TestDeployNamesMetrics(t *testing.T) {
	have := known(t)
	readme, err := os.ReadFile(filepath.Join("..", "..", "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for where, expr := range exprs(t) {
		if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "{") != strings.Count(expr, "}") {
			t.Errorf("%s: unbalanced brackets in %q", where, expr)
		}
		// Labels inside matchers are checked against their metric; the
		// rest of the query is read without its strings.
		var used []string
		for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
			labels, ok := have[m[1]]
			if !ok || labels == nil {
				continue // unknown: reported below; or not cairn's
			}
			for _, lm := range matcherRE.FindAllStringSubmatch(stringRE.ReplaceAllString(m[2], `""`), -1) {
				if !slices.Contains(labels, lm[1]) && !slices.Contains(targetLabels, lm[1]) {
					t.Errorf("%s: %s has no label %s", where, m[1], lm[1])
				}
			}
		}
		for _, m := range scrapeJobRE.FindAllStringSubmatch(expr, -1) {
			if !strings.Contains(string(readme), "job_name: "+m[1]+"\n") {
				t.Errorf("%s: scrape job %s is none that deploy/README.md configures", where, m[1])
			}
		}
		bare := stringRE.ReplaceAllString(expr, `""`)
		names := nameRE.FindAllString(bare, -1)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, expr)
		}
		for _, name := range names {
			labels, ok := have[name]
			if !ok {
				t.Errorf("%s: no metric %s", where, name)
			}
			used = append(used, labels...)
		}
		for _, g := range groupingRE.FindAllStringSubmatch(bare, -1) {
			for _, l := range strings.Split(g[2], ",") {
				if l = strings.TrimSpace(l); l != "" && !slices.Contains(used, l) && !slices.Contains(targetLabels, l) && !strings.HasPrefix(names[0], "etcd_") {
					t.Errorf("%s: %s (%s) names label %s, which none of %v has", where, g[1], g[2], l, names)
				}
			}
		}
	}
}
