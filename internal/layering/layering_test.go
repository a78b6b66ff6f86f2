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
// packages it must not import. "github.com/cairn-hpc/cairn/" in deny forbids every cairn package
// not in allow.
var rules = []struct {
	pkg   string
	allow []string // cairn packages allowed even if deny matches
	deny  []string
}{
	{"github.com/cairn-hpc/cairn/internal/chunker", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/store/pack", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/store/index", []string{"github.com/cairn-hpc/cairn/internal/store/pack"}, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/store", []string{"github.com/cairn-hpc/cairn/internal/store/pack", "github.com/cairn-hpc/cairn/internal/store/index", "github.com/cairn-hpc/cairn/internal/chunker"}, []string{"github.com/cairn-hpc/cairn/"}},
	// The durable tier keeps the store's formats in a bucket: the store
	// and its formats, nothing of the node stack or the coordinator.
	{"github.com/cairn-hpc/cairn/internal/store/tier", []string{"github.com/cairn-hpc/cairn/internal/store", "github.com/cairn-hpc/cairn/internal/store/pack", "github.com/cairn-hpc/cairn/internal/store/index", "github.com/cairn-hpc/cairn/internal/store/tier"}, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/durable", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/names", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/proc", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/cpufeat", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/pty", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/launch", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/image", []string{"github.com/cairn-hpc/cairn/internal/store", "github.com/cairn-hpc/cairn/internal/store/tier", "github.com/cairn-hpc/cairn/internal/chunker", "github.com/cairn-hpc/cairn/internal/durable", "github.com/cairn-hpc/cairn/internal/names"}, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/criu", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/lazy", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/failpoint", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/plan", nil, []string{"github.com/cairn-hpc/cairn/"}},
	// The overhead model is arithmetic on the wire's records: no I/O, no
	// clock, nothing of the coordinator.
	{"github.com/cairn-hpc/cairn/internal/model", []string{"github.com/cairn-hpc/cairn/api/coord/v1", "github.com/cairn-hpc/cairn/api/events/v1", "github.com/cairn-hpc/cairn/api/rank/v1", "github.com/cairn-hpc/cairn/internal/plan"}, []string{"github.com/cairn-hpc/cairn/", "net", "os", "os/exec", "go.etcd.io/"}},
	{"github.com/cairn-hpc/cairn/internal/pki", []string{"github.com/cairn-hpc/cairn/internal/durable"}, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/netw", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/coord/round", nil, []string{"github.com/cairn-hpc/cairn/", "net", "os/exec", "go.etcd.io/"}},
	// The coordinator's other protocols are pure machines too.
	{"github.com/cairn-hpc/cairn/internal/coord/machine", nil, []string{"github.com/cairn-hpc/cairn/", "net", "os/exec", "go.etcd.io/"}},
	// So is the policy that chooses which protocol follows what happened.
	{"github.com/cairn-hpc/cairn/internal/coord/policy", nil, []string{"github.com/cairn-hpc/cairn/", "net", "os", "os/exec", "go.etcd.io/"}},
	// The scripted-trace harness serves the machines' tests and needs
	// nothing of cairn itself.
	{"github.com/cairn-hpc/cairn/internal/tracetest", nil, []string{"github.com/cairn-hpc/cairn/", "net", "os/exec"}},
	// The in-memory agents model the agent API only: no network, no
	// processes, nothing of the node stack or the catalog.
	{"github.com/cairn-hpc/cairn/internal/coord/memagent", []string{"github.com/cairn-hpc/cairn/api/agent/v1", "github.com/cairn-hpc/cairn/api/coord/v1"}, []string{"github.com/cairn-hpc/cairn/", "net", "os/exec", "go.etcd.io/"}},
	{"github.com/cairn-hpc/cairn/api/", nil, []string{"github.com/cairn-hpc/cairn/internal/"}},
	{"github.com/cairn-hpc/cairn/internal/catalog", nil, []string{"github.com/cairn-hpc/cairn/"}},
	// The ring job speaks the rank API's wire to publish its progress.
	{"github.com/cairn-hpc/cairn/internal/ringapp", []string{"github.com/cairn-hpc/cairn/api/rank/v1"}, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/human", nil, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/version", nil, []string{"github.com/cairn-hpc/cairn/"}},
	// The CLI's tables know the objects they show, not how they are had.
	{"github.com/cairn-hpc/cairn/internal/table", []string{"github.com/cairn-hpc/cairn/api/agent/v1", "github.com/cairn-hpc/cairn/api/coord/v1", "github.com/cairn-hpc/cairn/api/events/v1", "github.com/cairn-hpc/cairn/internal/container", "github.com/cairn-hpc/cairn/internal/human", "github.com/cairn-hpc/cairn/internal/image", "github.com/cairn-hpc/cairn/internal/plan"}, []string{"github.com/cairn-hpc/cairn/"}},
	// The demos drive a Manager on this node, and a testbed only through
	// the cairn binary.
	{"github.com/cairn-hpc/cairn/internal/demo", []string{"github.com/cairn-hpc/cairn/api/coord/v1", "github.com/cairn-hpc/cairn/internal/container", "github.com/cairn-hpc/cairn/internal/human", "github.com/cairn-hpc/cairn/internal/netw", "github.com/cairn-hpc/cairn/internal/ringapp"}, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/rpc", []string{"github.com/cairn-hpc/cairn/api/agent/v1", "github.com/cairn-hpc/cairn/api/coord/v1", "github.com/cairn-hpc/cairn/api/events/v1", "github.com/cairn-hpc/cairn/internal/pki"}, []string{"github.com/cairn-hpc/cairn/"}},
	// The rank API's client (and its fake endpoint) runs inside ranks: it
	// knows the rank API's wire only.
	{"github.com/cairn-hpc/cairn/internal/rankclient", []string{"github.com/cairn-hpc/cairn/api/rank/v1"}, []string{"github.com/cairn-hpc/cairn/"}},
	// The coordinator reaches nodes only through the agent API: never
	// containers, images or the store directly.
	// The event stream knows nothing of what publishes to it.
	{"github.com/cairn-hpc/cairn/internal/events", []string{"github.com/cairn-hpc/cairn/api/events/v1", "github.com/cairn-hpc/cairn/internal/durable", "github.com/cairn-hpc/cairn/internal/proc"}, []string{"github.com/cairn-hpc/cairn/"}},
	{"github.com/cairn-hpc/cairn/internal/coord", []string{"github.com/cairn-hpc/cairn/api/agent/v1", "github.com/cairn-hpc/cairn/api/coord/v1", "github.com/cairn-hpc/cairn/api/events/v1", "github.com/cairn-hpc/cairn/internal/events", "github.com/cairn-hpc/cairn/internal/catalog", "github.com/cairn-hpc/cairn/internal/cpufeat", "github.com/cairn-hpc/cairn/internal/dashboard", "github.com/cairn-hpc/cairn/internal/failpoint", "github.com/cairn-hpc/cairn/internal/coord/round", "github.com/cairn-hpc/cairn/internal/coord/machine", "github.com/cairn-hpc/cairn/internal/coord/policy", "github.com/cairn-hpc/cairn/internal/launch", "github.com/cairn-hpc/cairn/internal/metrics", "github.com/cairn-hpc/cairn/internal/model", "github.com/cairn-hpc/cairn/internal/names", "github.com/cairn-hpc/cairn/internal/pki", "github.com/cairn-hpc/cairn/internal/rpc"}, []string{"github.com/cairn-hpc/cairn/"}},
	// The coordinator process: the catalog's etcd, the election, events
	// and hooks around coord; it answers the coordinator API while it
	// stands by.
	{"github.com/cairn-hpc/cairn/internal/control", []string{"github.com/cairn-hpc/cairn/api/coord/v1", "github.com/cairn-hpc/cairn/internal/catalog", "github.com/cairn-hpc/cairn/internal/coord", "github.com/cairn-hpc/cairn/internal/dashboard", "github.com/cairn-hpc/cairn/internal/durable", "github.com/cairn-hpc/cairn/internal/events", "github.com/cairn-hpc/cairn/internal/metrics", "github.com/cairn-hpc/cairn/internal/pki", "github.com/cairn-hpc/cairn/internal/rpc", "github.com/cairn-hpc/cairn/internal/service"}, []string{"github.com/cairn-hpc/cairn/"}},
	// What a daemon tells the service manager and probes: nothing of
	// either daemon.
	{"github.com/cairn-hpc/cairn/internal/service", nil, []string{"github.com/cairn-hpc/cairn/"}},
	// The dashboard shows what the coordinator's read methods and the
	// event stream tell it: the APIs' types, nothing of how they are had.
	{"github.com/cairn-hpc/cairn/internal/dashboard", []string{"github.com/cairn-hpc/cairn/api/agent/v1", "github.com/cairn-hpc/cairn/api/coord/v1", "github.com/cairn-hpc/cairn/api/events/v1", "github.com/cairn-hpc/cairn/internal/events", "github.com/cairn-hpc/cairn/internal/human", "github.com/cairn-hpc/cairn/internal/names"}, []string{"github.com/cairn-hpc/cairn/"}},
	// The metrics are linked by the coordinator and the agent alike: they
	// know the wire's records and events, nothing of either side.
	{"github.com/cairn-hpc/cairn/internal/metrics", []string{"github.com/cairn-hpc/cairn/api/coord/v1", "github.com/cairn-hpc/cairn/api/events/v1"}, []string{"github.com/cairn-hpc/cairn/", "go.etcd.io/", "os/exec"}},
	// The testbed runs the coordinator and the agents as processes and
	// talks to them through the API.
	{"github.com/cairn-hpc/cairn/internal/testbed", []string{"github.com/cairn-hpc/cairn/internal/container", "github.com/cairn-hpc/cairn/internal/durable", "github.com/cairn-hpc/cairn/internal/metrics", "github.com/cairn-hpc/cairn/internal/netw", "github.com/cairn-hpc/cairn/internal/pki", "github.com/cairn-hpc/cairn/internal/proc", "github.com/cairn-hpc/cairn/internal/rpc"}, []string{"github.com/cairn-hpc/cairn/"}},
	// A chaos run drives a testbed and its job through the coordinator's
	// API, and measures with the model.
	{"github.com/cairn-hpc/cairn/internal/chaos", []string{"github.com/cairn-hpc/cairn/api/agent/v1", "github.com/cairn-hpc/cairn/api/coord/v1", "github.com/cairn-hpc/cairn/api/events/v1", "github.com/cairn-hpc/cairn/api/rank/v1", "github.com/cairn-hpc/cairn/internal/model", "github.com/cairn-hpc/cairn/internal/ringapp", "github.com/cairn-hpc/cairn/internal/rpc", "github.com/cairn-hpc/cairn/internal/testbed"}, []string{"github.com/cairn-hpc/cairn/"}},
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
	{"github.com/cairn-hpc/cairn/internal/coord", []string{"github.com/cairn-hpc/cairn/internal/agent", "github.com/cairn-hpc/cairn/internal/container", "github.com/cairn-hpc/cairn/internal/criu", "github.com/cairn-hpc/cairn/internal/image", "github.com/cairn-hpc/cairn/internal/store", "github.com/cairn-hpc/cairn/internal/netw", "github.com/cairn-hpc/cairn/internal/lazy"}},
	{"github.com/cairn-hpc/cairn/internal/control", []string{"github.com/cairn-hpc/cairn/internal/agent", "github.com/cairn-hpc/cairn/internal/container", "github.com/cairn-hpc/cairn/internal/criu", "github.com/cairn-hpc/cairn/internal/image", "github.com/cairn-hpc/cairn/internal/store", "github.com/cairn-hpc/cairn/internal/netw", "github.com/cairn-hpc/cairn/internal/lazy"}},
	{"github.com/cairn-hpc/cairn/internal/dashboard", []string{"github.com/cairn-hpc/cairn/internal/agent", "github.com/cairn-hpc/cairn/internal/container", "github.com/cairn-hpc/cairn/internal/criu", "github.com/cairn-hpc/cairn/internal/image", "github.com/cairn-hpc/cairn/internal/store", "github.com/cairn-hpc/cairn/internal/netw", "github.com/cairn-hpc/cairn/internal/lazy", "github.com/cairn-hpc/cairn/internal/coord", "github.com/cairn-hpc/cairn/internal/catalog", "github.com/cairn-hpc/cairn/internal/rpc", "go.etcd.io/"}},
	{"github.com/cairn-hpc/cairn/internal/testbed", []string{"github.com/cairn-hpc/cairn/internal/agent", "github.com/cairn-hpc/cairn/internal/coord", "github.com/cairn-hpc/cairn/internal/control", "github.com/cairn-hpc/cairn/internal/catalog", "go.etcd.io/"}},
	{"github.com/cairn-hpc/cairn/internal/chaos", []string{"github.com/cairn-hpc/cairn/internal/agent", "github.com/cairn-hpc/cairn/internal/coord", "github.com/cairn-hpc/cairn/internal/control", "github.com/cairn-hpc/cairn/internal/catalog", "go.etcd.io/"}},
	{"github.com/cairn-hpc/cairn/internal/agent", []string{"github.com/cairn-hpc/cairn/internal/coord", "github.com/cairn-hpc/cairn/internal/catalog", "go.etcd.io/"}},
	{"github.com/cairn-hpc/cairn/internal/rpc", []string{"github.com/cairn-hpc/cairn/internal/agent", "github.com/cairn-hpc/cairn/internal/coord", "github.com/cairn-hpc/cairn/internal/container", "github.com/cairn-hpc/cairn/internal/store", "go.etcd.io/"}},
	{"github.com/cairn-hpc/cairn/internal/metrics", []string{"github.com/cairn-hpc/cairn/internal/agent", "github.com/cairn-hpc/cairn/internal/coord", "github.com/cairn-hpc/cairn/internal/control", "github.com/cairn-hpc/cairn/internal/catalog", "github.com/cairn-hpc/cairn/internal/container", "github.com/cairn-hpc/cairn/internal/criu", "github.com/cairn-hpc/cairn/internal/image", "github.com/cairn-hpc/cairn/internal/store", "github.com/cairn-hpc/cairn/internal/netw", "github.com/cairn-hpc/cairn/internal/lazy", "go.etcd.io/"}},
}

// TestReach checks the reach rules on the module's whole dependency graph.
func TestReach(t *testing.T) {
	graph := map[string][]string{}
	for _, p := range listPackages(t, "-deps", "github.com/cairn-hpc/cairn/...") {
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
		"github.com/cairn-hpc/cairn/internal/coord":      {"github.com/cairn-hpc/cairn/internal/rpc", "fmt"},
		"github.com/cairn-hpc/cairn/internal/rpc":        {"github.com/cairn-hpc/cairn/internal/helper"},
		"github.com/cairn-hpc/cairn/internal/helper":     {"github.com/cairn-hpc/cairn/internal/store/pack"},
		"github.com/cairn-hpc/cairn/internal/store/pack": nil,
		"github.com/cairn-hpc/cairn/internal/agent":      {"go.etcd.io/etcd/client/v3"},
	}
	got := reachViolations(graph)
	want := []string{
		"github.com/cairn-hpc/cairn/internal/agent reaches go.etcd.io/etcd/client/v3, which it must not: github.com/cairn-hpc/cairn/internal/agent -> go.etcd.io/etcd/client/v3",
		"github.com/cairn-hpc/cairn/internal/coord reaches github.com/cairn-hpc/cairn/internal/store/pack, which it must not: github.com/cairn-hpc/cairn/internal/coord -> github.com/cairn-hpc/cairn/internal/rpc -> github.com/cairn-hpc/cairn/internal/helper -> github.com/cairn-hpc/cairn/internal/store/pack",
		"github.com/cairn-hpc/cairn/internal/rpc reaches github.com/cairn-hpc/cairn/internal/store/pack, which it must not: github.com/cairn-hpc/cairn/internal/rpc -> github.com/cairn-hpc/cairn/internal/helper -> github.com/cairn-hpc/cairn/internal/store/pack",
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
	pkgs := listPackages(t, "github.com/cairn-hpc/cairn/...")
	for _, p := range pkgs {
		for _, r := range rules {
			if p.ImportPath != r.pkg && !strings.HasPrefix(p.ImportPath, strings.TrimSuffix(r.pkg, "/")+"/") {
				continue
			}
			if r.pkg == "github.com/cairn-hpc/cairn/internal/store" && p.ImportPath != r.pkg {
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
			case imp == "github.com/cairn-hpc/cairn/internal/store/pack" && !slices.Contains([]string{"github.com/cairn-hpc/cairn/internal/store", "github.com/cairn-hpc/cairn/internal/store/index", "github.com/cairn-hpc/cairn/internal/store/tier"}, p.ImportPath):
				t.Errorf("%s imports %s: only the store may", p.ImportPath, imp)
			case imp == "github.com/cairn-hpc/cairn/internal/store/index" && p.ImportPath != "github.com/cairn-hpc/cairn/internal/store" && p.ImportPath != "github.com/cairn-hpc/cairn/internal/store/tier":
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
