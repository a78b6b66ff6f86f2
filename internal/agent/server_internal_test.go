package agent

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/pki"
)

// callers are TLS peers of one cluster in each role, as rpc.Caller reads
// them from a verified connection.
func callers(t *testing.T) map[pki.Role]*tls.ConnectionState {
	t.Helper()
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[pki.Role]*tls.ConnectionState{}
	for role, name := range map[pki.Role]string{pki.Coordinator: "coord", pki.Client: "cli", pki.Agent: "n2"} {
		c, err := ca.Issue(name, role, pki.IssueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out[role] = &tls.ConnectionState{HandshakeComplete: true, VerifiedChains: [][]*x509.Certificate{{c.Cert(), ca.Cert}}}
	}
	return out
}

// The operations of the agent API, and whether other agents may call them.
var apiOps = []struct {
	method, path string
	agents       bool
}{
	{"GET", "/v1/health", false},
	{"GET", "/v1/containers", false},
	{"POST", "/v1/containers", false},
	{"GET", "/v1/containers/c", false},
	{"DELETE", "/v1/containers/c", false},
	{"POST", "/v1/checkpoint", false},
	{"POST", "/v1/restore", false},
	{"GET", "/v1/checkpoints", false},
	{"POST", "/v1/kill/c", false},
	{"GET", "/v1/logs/c", false},
	{"GET", "/v1/incarnations/c", false},
	{"POST", "/v1/exec/c", false},
	{"PUT", "/v1/jobnet", false},
	{"DELETE", "/v1/jobnet", false},
	{"POST", "/v1/ranks/run", false},
	{"POST", "/v1/ranks/restore", false},
	{"POST", "/v1/ranks/resume", false},
	{"POST", "/v1/ranks/remove", false},
	{"POST", "/v1/ckpt/prepare", false},
	{"POST", "/v1/ckpt/commit", false},
	{"POST", "/v1/ckpt/abort", false},
	{"POST", "/v1/ranks/stall", false},
	{"GET", "/v1/images/staged", true},
	{"POST", "/v1/ranks/migrate-in", false},
	{"POST", "/v1/ranks/migrate-out", false},
	{"POST", "/v1/images/fetch", false},
	{"GET", "/v1/images/export", true},
	{"GET", "/v1/images/chunks", true},
	{"POST", "/v1/images/delta", true},
	{"POST", "/v1/images/chunkdata", true},
	{"POST", "/v1/images/drop", false},
	{"GET", "/metrics", false},
}

// routed serves the agent API's routes with every operation replaced by
// one that answers 200 with the pattern it serves and the container it
// was asked about.
func routed() *api {
	routes := (&Server{}).routes()
	for i := range routes {
		pattern := routes[i].method + " " + routes[i].path
		routes[i].serve = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Route", pattern)
			w.Header().Set("Name", r.PathValue("name"))
			w.WriteHeader(http.StatusOK)
		}
	}
	return newAPI(routes, slog.New(slog.DiscardHandler))
}

type answer struct {
	status int
	code   string // the error's code, if any
	route  string // the operation that served it, if any
	name   string // and the container it was asked about
}

func ask(t *testing.T, h http.Handler, peer *tls.ConnectionState, method, target string) answer {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader("{}"))
	r.TLS = peer
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	a := answer{status: w.Code, route: w.Header().Get("Route"), name: w.Header().Get("Name")}
	if w.Code != http.StatusOK && w.Code != http.StatusNoContent {
		var e agentv1.Error
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
			t.Errorf("%s %s: HTTP %d with a body that is no API error: %q", method, target, w.Code, w.Body)
		}
		a.code = e.Code
	}
	return a
}

// TestRoutes: every operation of the API is served to the coordinator and
// clients, only image reads to other agents, and nothing else to anyone.
func TestRoutes(t *testing.T) {
	peers := callers(t)
	a := routed()
	for _, op := range apiOps {
		for _, role := range []pki.Role{pki.Coordinator, pki.Client, pki.Agent} {
			t.Run(string(role)+" "+op.method+" "+op.path, func(t *testing.T) {
				got := ask(t, a, peers[role], op.method, op.path)
				if role == pki.Agent && !op.agents {
					if got.status != http.StatusForbidden || got.code != agentv1.CodeForbidden || got.route != "" {
						t.Errorf("got %+v, want 403 %s", got, agentv1.CodeForbidden)
					}
					return
				}
				if got.status != http.StatusOK || got.route == "" {
					t.Errorf("got %+v, want the operation", got)
				}
				// Any other method on the path is not in the API; an agent
				// is refused every method of a path it may not call.
				for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"} {
					if served(op.path, m) {
						continue
					}
					got := ask(t, a, peers[role], m, op.path)
					if got.status != http.StatusNotFound || got.code != agentv1.CodeNotFound {
						t.Errorf("%s %s: got %+v, want 404 %s", m, op.path, got, agentv1.CodeNotFound)
					}
				}
			})
		}
	}
}

// served reports whether apiOps has method on path.
func served(path, method string) bool {
	for _, op := range apiOps {
		if op.path == path && op.method == method {
			return true
		}
	}
	return false
}

// TestRoutesEdges: paths outside the API, callers without a verified
// certificate, and container names that are no names.
func TestRoutesEdges(t *testing.T) {
	peers := callers(t)
	coord, agent := peers[pki.Coordinator], peers[pki.Agent]
	a := routed()
	for _, tc := range []struct {
		name           string
		peer           *tls.ConnectionState
		method, target string
		want           answer
	}{
		{"no TLS", nil, "GET", "/v1/health", answer{status: 401, code: agentv1.CodeUnauthorized}},
		{"handshake not done", &tls.ConnectionState{}, "GET", "/v1/health", answer{status: 401, code: agentv1.CodeUnauthorized}},
		{"unknown path", coord, "GET", "/v1/nothing", answer{status: 404, code: agentv1.CodeNotFound}},
		{"unknown path, agent", agent, "GET", "/v1/nothing", answer{status: 403, code: agentv1.CodeForbidden}},
		{"root", coord, "GET", "/", answer{status: 404, code: agentv1.CodeNotFound}},
		{"trailing slash", coord, "GET", "/v1/health/", answer{status: 404, code: agentv1.CodeNotFound}},
		{"container list with a slash", coord, "GET", "/v1/containers/", answer{status: 200, route: "GET /v1/containers/{name...}"}},
		{"no name, no slash", coord, "DELETE", "/v1/containers", answer{status: 404, code: agentv1.CodeNotFound}},
		{"logs without a name", coord, "GET", "/v1/logs", answer{status: 404, code: agentv1.CodeNotFound}},
		{"query", coord, "DELETE", "/v1/containers/c?force=1", answer{status: 200, route: "DELETE /v1/containers/{name...}", name: "c"}},
		{"escaped slash", coord, "GET", "/v1/containers/a%2Fb", answer{status: 200, route: "GET /v1/containers/{name...}", name: "a/b"}},
		{"slash", coord, "GET", "/v1/logs/a/b", answer{status: 200, route: "GET /v1/logs/{name...}", name: "a/b"}},
		{"dot dot", coord, "GET", "/v1/containers/..", answer{status: 200, route: "GET /v1/containers/{name...}", name: ".."}},
		{"dot", coord, "POST", "/v1/kill/.", answer{status: 200, route: "POST /v1/kill/{name...}", name: "."}},
		{"dot dot inside", coord, "GET", "/v1/incarnations/a/../b", answer{status: 200, route: "GET /v1/incarnations/{name...}", name: "a/../b"}},
		{"double slash", coord, "GET", "/v1/containers/a//b", answer{status: 200, route: "GET /v1/containers/{name...}", name: "a//b"}},
		{"double slash in an operation", coord, "GET", "/v1//health", answer{status: 404, code: agentv1.CodeNotFound}},
		{"dot dot out of an operation", coord, "GET", "/v1/nothing/../health", answer{status: 404, code: agentv1.CodeNotFound}},
		{"escaped letter", coord, "GET", "/v1/%68ealth", answer{status: 200, route: "GET /v1/health"}},
		{"agent, other method of an image read", agent, "POST", "/v1/images/export", answer{status: 404, code: agentv1.CodeNotFound}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ask(t, a, tc.peer, tc.method, tc.target); got != tc.want {
				t.Errorf("%s %s: got %+v, want %+v", tc.method, tc.target, got, tc.want)
			}
		})
	}
}

// TestServerRefusesBadNames: the operations on a named container refuse a
// name that is none as a bad request, before anything of the node is
// touched (this Server has no Manager).
func TestServerRefusesBadNames(t *testing.T) {
	coord := callers(t)[pki.Coordinator]
	s := &Server{}
	for _, target := range []string{
		"GET /v1/containers/..", "GET /v1/containers/", "DELETE /v1/containers/a%2Fb", "GET /v1/containers/a/b",
		"GET /v1/logs/..", "GET /v1/incarnations/.", "POST /v1/kill/..?signal=9", "POST /v1/kill/c?signal=x",
		"GET /v1/images/staged?container=..&seq=1", "GET /v1/images/export?container=c&seq=x",
	} {
		method, path, _ := strings.Cut(target, " ")
		if got := ask(t, s, coord, method, path); got.status != http.StatusBadRequest || got.code != agentv1.CodeBadRequest {
			t.Errorf("%s: got %+v, want 400 %s", target, got, agentv1.CodeBadRequest)
		}
	}
}
