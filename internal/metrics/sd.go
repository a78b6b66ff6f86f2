package metrics

import (
	"sort"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
)

// TargetsPath is where the coordinator lists the agents to scrape, in
// Prometheus's HTTP service discovery format (http_sd_configs): what a
// client certificate or the read-only token may read, besides Path.
const TargetsPath = "/metrics/targets"

// TargetGroup is one entry of Prometheus's HTTP service discovery.
type TargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// Targets lists every node the coordinator knows as a scrape target, at
// its agent API's address: the dead ones too, whose failing scrapes fire
// CairnAgentDown. Each has the label node, and meta labels
// (__meta_cairn_*: alive, spare, drained, and each node label as
// __meta_cairn_label_KEY) for relabelling.
func Targets(nodes []coordv1.Node) []TargetGroup {
	out := []TargetGroup{} // [] rather than null: Prometheus reads no targets
	for _, n := range nodes {
		l := map[string]string{
			"node":                  n.Name,
			"__meta_cairn_alive":    boolLabel(n.Alive),
			"__meta_cairn_spare":    boolLabel(n.Spare),
			"__meta_cairn_drained":  boolLabel(n.Drained),
			"__meta_cairn_underlay": n.Underlay,
		}
		for k, v := range n.Labels {
			l["__meta_cairn_label_"+labelName(k)] = v
		}
		out = append(out, TargetGroup{Targets: []string{n.Addr}, Labels: l})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Labels["node"] < out[j].Labels["node"] })
	return out
}

func boolLabel(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// labelName makes a node label's key a Prometheus label name: anything
// but letters, digits and _ becomes _.
func labelName(k string) string {
	b := []byte(k)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}
