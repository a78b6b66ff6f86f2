package coord_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

type testCoord struct {
	ca   *pki.CA
	addr string
	co   *coord.Coordinator
}

func issue(t *testing.T, ca *pki.CA, name string, role pki.Role) *pki.Credentials {
	t.Helper()
	c, err := ca.Issue(name, role, pki.IssueOptions{IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startCoordinator runs a coordinator on an embedded etcd until the test
// ends.
func startCoordinator(t *testing.T, opts coord.Options) *testCoord {
	t.Helper()
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return startCoordinatorOf(t, ca, opts)
}

// startCoordinatorOf is startCoordinator in the cluster of ca.
func startCoordinatorOf(t *testing.T, ca *pki.CA, opts coord.Options) *testCoord {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.Open(ctx, catalog.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	co := coord.New(cat, issue(t, ca, rpc.CoordServerName, pki.Coordinator), nil, opts)
	done := make(chan error, 1)
	go func() { done <- co.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		cat.Close()
		e.Close()
	})
	return &testCoord{ca: ca, addr: ln.Addr().String(), co: co}
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var e *coordv1.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("error %v, want API error %s", err, code)
	}
}

func join(name string) coordv1.Join {
	return coordv1.Join{Name: name, Addr: "127.0.0.1:1", Underlay: "127.0.0.1"}
}

// TestSecurity: only agents of this cluster join, each only as the node its
// certificate names; a caller without credentials, or with another
// cluster's, gets no TLS connection at all; agents cannot drive jobs.
func TestSecurity(t *testing.T) {
	tc := startCoordinator(t, coord.Options{})
	ctx := context.Background()

	good := rpc.NewCoordClient(tc.addr, issue(t, tc.ca, "n1", pki.Agent))
	defer good.Close()
	if _, err := good.Join(ctx, join("n1")); err != nil {
		t.Fatalf("agent n1 joining as itself: %v", err)
	}
	if hb, err := good.Heartbeat(ctx, coordv1.Heartbeat{Name: "n1"}); err != nil {
		t.Fatalf("heartbeat: %v", err)
	} else if term, err := agentv1.ParseTerm(hb.Term); err != nil || term != tc.co.Term() {
		t.Errorf("heartbeat reply tells term %q, want the coordinator's %s", hb.Term, tc.co.Term())
	}
	_, err := good.Join(ctx, join("n2"))
	wantCode(t, err, agentv1.CodeForbidden)
	_, err = good.Heartbeat(ctx, coordv1.Heartbeat{Name: "n2"})
	wantCode(t, err, agentv1.CodeForbidden)
	_, err = good.Jobs(ctx)
	wantCode(t, err, agentv1.CodeForbidden)
	_, err = good.RunJob(ctx, coordv1.RunJob{Name: "x", Ranks: 1, Args: []string{"true"}})
	wantCode(t, err, agentv1.CodeForbidden)

	client := rpc.NewCoordClient(tc.addr, issue(t, tc.ca, "alice", pki.Client))
	defer client.Close()
	_, err = client.Join(ctx, join("alice"))
	wantCode(t, err, agentv1.CodeForbidden)
	nodes, err := client.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].Name != "n1" || !nodes[0].Alive {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}

	// Another cluster's agent, with a name this cluster knows.
	other, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	foreign := rpc.NewCoordClient(tc.addr, issue(t, other, "n1", pki.Agent))
	defer foreign.Close()
	_, err = foreign.Join(ctx, join("n1"))
	var api *coordv1.Error
	if err == nil || errors.As(err, &api) {
		t.Fatalf("agent of another cluster: %v, want a TLS failure", err)
	}
	// No certificate at all.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 5 * time.Second}
	resp, err := hc.Get("https://" + tc.addr + coordv1.PathNodes)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a caller without a certificate got HTTP %d", resp.StatusCode)
	}
	if !strings.Contains(err.Error(), "certificate") && !strings.Contains(err.Error(), "tls") {
		t.Logf("no-certificate error: %v", err)
	}
	// The catalog holds only the node that joined properly.
	nodes, err = client.Nodes(ctx)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes after refused joins: %+v %v", nodes, err)
	}
}

// TestMembership: a node whose heartbeats stop is dead after its TTL, and
// alive again after its next heartbeat.
func TestMembership(t *testing.T) {
	ttl := 2 * time.Second
	tc := startCoordinator(t, coord.Options{NodeTTL: ttl})
	ctx := context.Background()
	a := rpc.NewCoordClient(tc.addr, issue(t, tc.ca, "n1", pki.Agent))
	defer a.Close()
	client := rpc.NewCoordClient(tc.addr, issue(t, tc.ca, "cli", pki.Client))
	defer client.Close()
	reply, err := a.Join(ctx, join("n1"))
	if err != nil || reply.TTL != ttl || reply.Heartbeat <= 0 || reply.Heartbeat >= ttl {
		t.Fatalf("join: %+v %v", reply, err)
	}
	alive := func() bool {
		nodes, err := client.Nodes(ctx)
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes: %+v %v", nodes, err)
		}
		return nodes[0].Alive
	}
	// Heartbeats keep it alive well past the TTL.
	for i := 0; i < 8; i++ {
		time.Sleep(reply.Heartbeat)
		if _, err := a.Heartbeat(ctx, coordv1.Heartbeat{Name: "n1"}); err != nil {
			t.Fatal(err)
		}
	}
	if !alive() {
		t.Fatal("node dead though it sent heartbeats")
	}
	start := time.Now()
	for alive() {
		if time.Since(start) > ttl+3*time.Second {
			t.Fatalf("node still alive %s after its last heartbeat (TTL %s)", time.Since(start), ttl)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("silent node dead after %s (TTL %s)", time.Since(start).Round(10*time.Millisecond), ttl)
	if _, err := a.Heartbeat(ctx, coordv1.Heartbeat{Name: "n1"}); err != nil {
		t.Fatal(err)
	}
	if !alive() {
		t.Fatal("node not alive again after a heartbeat")
	}
}

// TestJobRequests checks the coordinator's answers to bad job requests.
func TestJobRequests(t *testing.T) {
	tc := startCoordinator(t, coord.Options{})
	ctx := context.Background()
	client := rpc.NewCoordClient(tc.addr, issue(t, tc.ca, "cli", pki.Client))
	defer client.Close()
	_, err := client.RunJob(ctx, coordv1.RunJob{Name: "Bad.Name", Ranks: 1, Args: []string{"true"}})
	wantCode(t, err, agentv1.CodeBadRequest)
	_, err = client.RunJob(ctx, coordv1.RunJob{Name: "j", Ranks: 0, Args: []string{"true"}})
	wantCode(t, err, agentv1.CodeBadRequest)
	_, err = client.RunJob(ctx, coordv1.RunJob{Name: "j", Ranks: 2, Args: []string{"true"}})
	wantCode(t, err, coordv1.CodeNoNodes)
	_, err = client.Status(ctx, "nope")
	wantCode(t, err, agentv1.CodeNotFound)
	_, err = client.Checkpoint(ctx, "nope", coordv1.CheckpointJob{})
	wantCode(t, err, agentv1.CodeNotFound)
	_, err = client.Restart(ctx, "nope", coordv1.Restart{})
	wantCode(t, err, agentv1.CodeNotFound)
}
