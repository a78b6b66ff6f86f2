package layering_test

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

type pkg struct {
	ImportPath string
	Imports    []string
}

// rules: for a package (prefix match), the cairn packages and the standard
// packages it must not import. "cairn/" in deny forbids every cairn package
// not in allow.
var rules = []struct {
	pkg   string
	allow []string // cairn packages allowed even if deny matches
	deny  []string
}{
	{"cairn/internal/chunker", nil, []string{"cairn/"}},
	{"cairn/internal/store/pack", nil, []string{"cairn/"}},
	{"cairn/internal/store/index", []string{"cairn/internal/store/pack"}, []string{"cairn/"}},
	{"cairn/internal/store", []string{"cairn/internal/store/pack", "cairn/internal/store/index", "cairn/internal/chunker"}, []string{"cairn/"}},
	// The durable tier keeps the store's formats in a bucket: the store
	// and its formats, nothing of the node stack or the coordinator.
	{"cairn/internal/store/tier", []string{"cairn/internal/store", "cairn/internal/store/pack", "cairn/internal/store/index", "cairn/internal/store/tier"}, []string{"cairn/"}},
	{"cairn/internal/durable", nil, []string{"cairn/"}},
	{"cairn/internal/names", nil, []string{"cairn/"}},
	{"cairn/internal/proc", nil, []string{"cairn/"}},
	{"cairn/internal/launch", nil, []string{"cairn/"}},
	{"cairn/internal/image", []string{"cairn/internal/store", "cairn/internal/store/tier", "cairn/internal/chunker", "cairn/internal/durable", "cairn/internal/names"}, []string{"cairn/"}},
	{"cairn/internal/criu", nil, []string{"cairn/"}},
	{"cairn/internal/lazy", nil, []string{"cairn/"}},
	{"cairn/internal/failpoint", nil, []string{"cairn/"}},
	{"cairn/internal/plan", nil, []string{"cairn/"}},
	// The overhead model is arithmetic on the wire's records: no I/O, no
	// clock, nothing of the coordinator.
	{"cairn/internal/model", []string{"cairn/api/coord/v1", "cairn/api/events/v1", "cairn/api/rank/v1", "cairn/internal/plan"}, []string{"cairn/", "net", "os", "os/exec", "go.etcd.io/"}},
	{"cairn/internal/pki", []string{"cairn/internal/durable"}, []string{"cairn/"}},
	{"cairn/internal/netw", nil, []string{"cairn/"}},
	{"cairn/internal/coord/round", nil, []string{"cairn/", "net", "os/exec", "go.etcd.io/"}},
	// The coordinator's other protocols are pure machines too.
	{"cairn/internal/coord/machine", nil, []string{"cairn/", "net", "os/exec", "go.etcd.io/"}},
	// So is the policy that chooses which protocol follows what happened.
	{"cairn/internal/coord/policy", nil, []string{"cairn/", "net", "os", "os/exec", "go.etcd.io/"}},
	// The scripted-trace harness serves the machines' tests and needs
	// nothing of cairn itself.
	{"cairn/internal/tracetest", nil, []string{"cairn/", "net", "os/exec"}},
	// The in-memory agents model the agent API only: no network, no
	// processes, nothing of the node stack or the catalog.
	{"cairn/internal/coord/memagent", []string{"cairn/api/agent/v1", "cairn/api/coord/v1"}, []string{"cairn/", "net", "os/exec", "go.etcd.io/"}},
	{"cairn/api/", nil, []string{"cairn/internal/"}},
	{"cairn/internal/catalog", nil, []string{"cairn/"}},
	// The ring job speaks the rank API's wire to publish its progress.
	{"cairn/internal/ringapp", []string{"cairn/api/rank/v1"}, []string{"cairn/"}},
	{"cairn/internal/human", nil, []string{"cairn/"}},
	{"cairn/internal/version", nil, []string{"cairn/"}},
	// The CLI's tables know the objects they show, not how they are had.
	{"cairn/internal/table", []string{"cairn/api/agent/v1", "cairn/api/coord/v1", "cairn/api/events/v1", "cairn/internal/container", "cairn/internal/human", "cairn/internal/image", "cairn/internal/plan"}, []string{"cairn/"}},
	// The demos drive a Manager on this node, and a testbed only through
	// the cairn binary.
	{"cairn/internal/demo", []string{"cairn/api/coord/v1", "cairn/internal/container", "cairn/internal/human", "cairn/internal/netw", "cairn/internal/ringapp"}, []string{"cairn/"}},
	{"cairn/internal/rpc", []string{"cairn/api/agent/v1", "cairn/api/coord/v1", "cairn/api/events/v1", "cairn/internal/pki"}, []string{"cairn/"}},
	// The rank API's client (and its fake endpoint) runs inside ranks: it
	// knows the rank API's wire only.
	{"cairn/internal/rankclient", []string{"cairn/api/rank/v1"}, []string{"cairn/"}},
	// The coordinator reaches nodes only through the agent API: never
	// containers, images or the store directly.
	// The event stream knows nothing of what publishes to it.
	{"cairn/internal/events", []string{"cairn/api/events/v1", "cairn/internal/durable", "cairn/internal/proc"}, []string{"cairn/"}},
	{"cairn/internal/coord", []string{"cairn/api/agent/v1", "cairn/api/coord/v1", "cairn/api/events/v1", "cairn/internal/events", "cairn/internal/catalog", "cairn/internal/dashboard", "cairn/internal/failpoint", "cairn/internal/coord/round", "cairn/internal/coord/machine", "cairn/internal/coord/policy", "cairn/internal/launch", "cairn/internal/metrics", "cairn/internal/model", "cairn/internal/names", "cairn/internal/pki", "cairn/internal/rpc"}, []string{"cairn/"}},
	// The coordinator process: the catalog's etcd, the election, events
	// and hooks around coord; it answers the coordinator API while it
	// stands by.
	{"cairn/internal/control", []string{"cairn/api/coord/v1", "cairn/internal/catalog", "cairn/internal/coord", "cairn/internal/dashboard", "cairn/internal/events", "cairn/internal/metrics", "cairn/internal/pki", "cairn/internal/rpc", "cairn/internal/service"}, []string{"cairn/"}},
	// What a daemon tells the service manager and probes: nothing of
	// either daemon.
	{"cairn/internal/service", nil, []string{"cairn/"}},
	// The dashboard shows what the coordinator's read methods and the
	// event stream tell it: the APIs' types, nothing of how they are had.
	{"cairn/internal/dashboard", []string{"cairn/api/agent/v1", "cairn/api/coord/v1", "cairn/api/events/v1", "cairn/internal/events", "cairn/internal/human", "cairn/internal/names"}, []string{"cairn/"}},
	// The metrics are linked by the coordinator and the agent alike: they
	// know the wire's records and events, nothing of either side.
	{"cairn/internal/metrics", []string{"cairn/api/coord/v1", "cairn/api/events/v1"}, []string{"cairn/", "go.etcd.io/", "os/exec"}},
	// The testbed runs the coordinator and the agents as processes and
	// talks to them through the API.
	{"cairn/internal/testbed", []string{"cairn/internal/container", "cairn/internal/durable", "cairn/internal/metrics", "cairn/internal/netw", "cairn/internal/pki", "cairn/internal/proc", "cairn/internal/rpc"}, []string{"cairn/"}},
	// A chaos run drives a testbed and its job through the coordinator's
	// API, and measures with the model.
	{"cairn/internal/chaos", []string{"cairn/api/coord/v1", "cairn/api/events/v1", "cairn/api/rank/v1", "cairn/internal/model", "cairn/internal/ringapp", "cairn/internal/rpc", "cairn/internal/testbed"}, []string{"cairn/"}},
}

// reach are rules on everything a package depends on, directly or not.
// The coordinator (coord, and the process around it, control) reaches
// nodes only through the agent API (rpc): nothing of the node stack is
// linked into it. The agent knows nothing of the coordinator's catalog
// (etcd). The testbed links neither: it runs them as processes. The
// dashboard reaches neither the node stack nor the catalog: it reads
// through the coordinator's methods.
var reach = []struct {
	pkg  string
	deny []string
}{
	{"cairn/internal/coord", []string{"cairn/internal/agent", "cairn/internal/container", "cairn/internal/criu", "cairn/internal/image", "cairn/internal/store", "cairn/internal/netw", "cairn/internal/lazy"}},
	{"cairn/internal/control", []string{"cairn/internal/agent", "cairn/internal/container", "cairn/internal/criu", "cairn/internal/image", "cairn/internal/store", "cairn/internal/netw", "cairn/internal/lazy"}},
	{"cairn/internal/dashboard", []string{"cairn/internal/agent", "cairn/internal/container", "cairn/internal/criu", "cairn/internal/image", "cairn/internal/store", "cairn/internal/netw", "cairn/internal/lazy", "cairn/internal/coord", "cairn/internal/catalog", "cairn/internal/rpc", "go.etcd.io/"}},
	{"cairn/internal/testbed", []string{"cairn/internal/agent", "cairn/internal/coord", "cairn/internal/control", "cairn/internal/catalog", "go.etcd.io/"}},
	{"cairn/internal/chaos", []string{"cairn/internal/agent", "cairn/internal/coord", "cairn/internal/control", "cairn/internal/catalog", "go.etcd.io/"}},
	{"cairn/internal/agent", []string{"cairn/internal/coord", "cairn/internal/catalog", "go.etcd.io/"}},
	{"cairn/internal/rpc", []string{"cairn/internal/agent", "cairn/internal/coord", "cairn/internal/container", "cairn/internal/store", "go.etcd.io/"}},
	{"cairn/internal/metrics", []string{"cairn/internal/agent", "cairn/internal/coord", "cairn/internal/control", "cairn/internal/catalog", "cairn/internal/container", "cairn/internal/criu", "cairn/internal/image", "cairn/internal/store", "cairn/internal/netw", "cairn/internal/lazy", "go.etcd.io/"}},
}

// TestReach checks the reach rules on the module's whole dependency graph.
func TestReach(t *testing.T) {
	graph := map[string][]string{}
	for _, p := range listPackages(t, "-deps", "cairn/...") {
		graph[p.ImportPath] = p.Imports
	}
	if len(graph) < 50 {
		t.Fatalf("go list found only %d packages", len(graph))
	}
	for _, v := range reachViolations(graph) {
		t.Error(v)
	}
}

// TestReachFindsViolations: a deliberate violation two imports deep is
// found, with the path that makes it.
func TestReachFindsViolations(t *testing.T) {
	graph := map[string][]string{
		"cairn/internal/coord":      {"cairn/internal/rpc", "fmt"},
		"cairn/internal/rpc":        {"cairn/internal/helper"},
		"cairn/internal/helper":     {"cairn/internal/store/pack"},
		"cairn/internal/store/pack": nil,
		"cairn/internal/agent":      {"go.etcd.io/etcd/client/v3"},
	}
	got := reachViolations(graph)
	want := []string{
		"cairn/internal/agent reaches go.etcd.io/etcd/client/v3, which it must not: cairn/internal/agent -> go.etcd.io/etcd/client/v3",
		"cairn/internal/coord reaches cairn/internal/store/pack, which it must not: cairn/internal/coord -> cairn/internal/rpc -> cairn/internal/helper -> cairn/internal/store/pack",
		"cairn/internal/rpc reaches cairn/internal/store/pack, which it must not: cairn/internal/rpc -> cairn/internal/helper -> cairn/internal/store/pack",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// reachViolations lists, sorted, every package of graph (import path ->
// imports) that reaches one its reach rule denies, with the import path
// that does it (the first found, breadth first).
func reachViolations(graph map[string][]string) []string {
	var out []string
	for _, r := range reach {
		if _, ok := graph[r.pkg]; !ok {
			continue
		}
		from := map[string]string{r.pkg: ""}
		queue := []string{r.pkg}
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			for _, imp := range graph[p] {
				if _, seen := from[imp]; seen {
					continue
				}
				from[imp] = p
				queue = append(queue, imp)
			}
		}
		for dep := range from {
			for _, d := range r.deny {
				if dep == d || strings.HasPrefix(dep, strings.TrimSuffix(d, "/")+"/") {
					path := []string{dep}
					for p := from[dep]; p != ""; p = from[p] {
						path = append([]string{p}, path...)
					}
					out = append(out, fmt.Sprintf("%s reaches %s, which it must not: %s", r.pkg, dep, strings.Join(path, " -> ")))
					break
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestLayering(t *testing.T) {
	pkgs := listPackages(t, "cairn/...")
	for _, p := range pkgs {
		for _, r := range rules {
			if p.ImportPath != r.pkg && !strings.HasPrefix(p.ImportPath, strings.TrimSuffix(r.pkg, "/")+"/") {
				continue
			}
			if r.pkg == "cairn/internal/store" && p.ImportPath != r.pkg {
				continue // store/pack, store/index and store/tier have rules of their own
			}
			for _, imp := range p.Imports {
				if allowed(imp, r.allow) {
					continue
				}
				for _, d := range r.deny {
					if imp == d || strings.HasPrefix(imp, d) && (strings.HasSuffix(d, "/") || strings.HasPrefix(imp, d+"/")) {
						t.Errorf("%s imports %s, which the layering forbids", p.ImportPath, imp)
					}
				}
			}
		}
		// Only store, store/index and the durable tier may import
		// store/pack; only store and the tier may import store/index.
		for _, imp := range p.Imports {
			switch {
			case imp == "cairn/internal/store/pack" && !slices.Contains([]string{"cairn/internal/store", "cairn/internal/store/index", "cairn/internal/store/tier"}, p.ImportPath):
				t.Errorf("%s imports %s: only the store may", p.ImportPath, imp)
			case imp == "cairn/internal/store/index" && p.ImportPath != "cairn/internal/store" && p.ImportPath != "cairn/internal/store/tier":
				t.Errorf("%s imports %s: only the store may", p.ImportPath, imp)
			}
		}
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
}

// listPackages runs go list -json with args.
func listPackages(t *testing.T, args ...string) []pkg {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-json"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			return pkgs
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
}

func allowed(imp string, allow []string) bool {
	for _, a := range allow {
		if imp == a {
			return true
		}
	}
	return false
}
