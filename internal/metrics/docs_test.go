package metrics_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/metrics"
)

// TestDocsListEveryMetric: docs/cluster.md lists every family, with its
// type.
func TestDocsListEveryMetric(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "cluster.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	var defs []metrics.Def
	defs = append(defs, metrics.NewCoord(metrics.CoordOptions{Certs: certs}).Defs()...)
	defs = append(defs, metrics.NewNode(metrics.NodeOptions{Node: "n1", Certs: certs}).Defs()...)
	for _, d := range defs {
		line := regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(d.Name) + "` \\| " + d.Type + " \\|.*$").FindString(doc)
		if line == "" {
			t.Errorf("docs/cluster.md has no line | `%s` | %s | ...", d.Name, d.Type)
			continue
		}
		for _, l := range d.Labels {
			if !strings.Contains(line, l) {
				t.Errorf("docs/cluster.md: %s's line does not name its label %s", d.Name, l)
			}
		}
	}
}
