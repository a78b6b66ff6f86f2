package layering_test

import (
	"encoding/json"
	"io"
	"os/exec"
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
	{"cairn/internal/durable", nil, []string{"cairn/"}},
	{"cairn/internal/names", nil, []string{"cairn/"}},
	{"cairn/internal/proc", nil, []string{"cairn/"}},
	{"cairn/internal/launch", nil, []string{"cairn/"}},
	{"cairn/internal/image", []string{"cairn/internal/store", "cairn/internal/chunker", "cairn/internal/durable", "cairn/internal/names"}, []string{"cairn/"}},
	{"cairn/internal/criu", nil, []string{"cairn/"}},
	{"cairn/internal/lazy", nil, []string{"cairn/"}},
	{"cairn/internal/plan", nil, []string{"cairn/"}},
	{"cairn/internal/pki", []string{"cairn/internal/durable"}, []string{"cairn/"}},
	{"cairn/internal/netw", nil, []string{"cairn/"}},
	{"cairn/internal/coord/round", nil, []string{"cairn/", "net", "os/exec", "go.etcd.io/"}},
	{"cairn/api/", nil, []string{"cairn/internal/"}},
	{"cairn/internal/catalog", nil, []string{"cairn/"}},
	{"cairn/internal/ringapp", nil, []string{"cairn/"}},
	{"cairn/internal/rpc", []string{"cairn/api/agent/v1", "cairn/api/coord/v1", "cairn/internal/pki"}, []string{"cairn/"}},
	// The coordinator reaches nodes only through the agent API: never
	// containers, images or the store directly.
	// The event stream knows nothing of what publishes to it.
	{"cairn/internal/events", []string{"cairn/api/events/v1", "cairn/internal/durable", "cairn/internal/proc"}, []string{"cairn/"}},
	{"cairn/internal/coord", []string{"cairn/api/agent/v1", "cairn/api/coord/v1", "cairn/api/events/v1", "cairn/internal/events", "cairn/internal/agent", "cairn/internal/catalog", "cairn/internal/coord/round", "cairn/internal/launch", "cairn/internal/names", "cairn/internal/pki", "cairn/internal/rpc"}, []string{"cairn/"}},
}

func TestLayering(t *testing.T) {
	out, err := exec.Command("go", "list", "-json", "cairn/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var n int
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		n++
		for _, r := range rules {
			if p.ImportPath != r.pkg && !strings.HasPrefix(p.ImportPath, strings.TrimSuffix(r.pkg, "/")+"/") {
				continue
			}
			if r.pkg == "cairn/internal/store" && p.ImportPath != r.pkg {
				continue // store/pack and store/index have rules of their own
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
		// Only store and store/index may import store/pack; only store may
		// import store/index.
		for _, imp := range p.Imports {
			switch {
			case imp == "cairn/internal/store/pack" && p.ImportPath != "cairn/internal/store" && p.ImportPath != "cairn/internal/store/index":
				t.Errorf("%s imports %s: only the store may", p.ImportPath, imp)
			case imp == "cairn/internal/store/index" && p.ImportPath != "cairn/internal/store":
				t.Errorf("%s imports %s: only the store may", p.ImportPath, imp)
			}
		}
	}
	if n < 10 {
		t.Fatalf("go list found only %d packages", n)
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
