package agent_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/agent"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/cpufeat"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/testutil"
	"github.com/cairn-hpc/cairn/internal/version"
)

// TestNewRefusesOtherCredentials: an agent runs only with an agent's
// credentials.
func TestNewRefusesOtherCredentials(t *testing.T) {
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := issue(t, ca, "cli", pki.Client).Write(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.New(agent.Config{Creds: dir}); err == nil || !strings.Contains(err.Error(), "not an agent") {
		t.Errorf("client credentials: %v", err)
	}
	if _, err := agent.New(agent.Config{}); err == nil {
		t.Error("no credentials accepted")
	}
}

// TestNewFindsUnderlayDevice: job networks go out of the device that
// holds the node's underlay address; an address no interface holds is
// refused at start rather than at the first job.
func TestNewFindsUnderlayDevice(t *testing.T) {
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := issue(t, ca, "n1", pki.Agent).Write(dir); err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{Creds: dir, Listen: "127.0.0.1:0", Coordinator: "127.0.0.1:1",
		Underlay: netip.MustParseAddr("192.0.2.77")}
	if _, err := agent.New(cfg); err == nil || !strings.Contains(err.Error(), "no interface") {
		t.Errorf("underlay no interface holds: %v", err)
	}
}

// fakeCoord answers joins and heartbeats as the coordinator does, and
// forgets the node once (404 to a heartbeat), so that it joins again.
type fakeCoord struct {
	mu         sync.Mutex
	joins      []coordv1.Join
	heartbeats []coordv1.Heartbeat
	forgot     bool
}

func (f *fakeCoord) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case coordv1.PathJoin:
		var j coordv1.Join
		if !rpc.Decode(w, r, &j) {
			return
		}
		f.joins = append(f.joins, j)
		rpc.WriteJSON(w, http.StatusOK, coordv1.JoinReply{Heartbeat: 20 * time.Millisecond})
	case coordv1.PathHeartbeat:
		var hb coordv1.Heartbeat
		if !rpc.Decode(w, r, &hb) {
			return
		}
		if !f.forgot {
			f.forgot = true
			rpc.Fail(w, http.StatusNotFound, agentv1.CodeNotFound, "no node "+hb.Name)
			return
		}
		f.heartbeats = append(f.heartbeats, hb)
		w.WriteHeader(http.StatusNoContent)
	default:
		rpc.Fail(w, http.StatusNotFound, agentv1.CodeNotFound, r.URL.Path)
	}
}

func (f *fakeCoord) seen() (joins []coordv1.Join, heartbeats int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]coordv1.Join(nil), f.joins...), len(f.heartbeats)
}

// TestAgentRun: an agent serves the agent API on its listener, joins the
// coordinator as the node its certificate names, sends heartbeats, joins
// again when the coordinator forgot it, and stops when its context ends.
func TestAgentRun(t *testing.T) {
	env := testutil.NewEnv(t)
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	localhost := net.ParseIP("127.0.0.1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	fc := &fakeCoord{}
	cln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	coordCreds := issue(t, ca, rpc.CoordServerName, pki.Coordinator, localhost)
	coordDone := make(chan error, 1)
	go func() { coordDone <- rpc.Serve(ctx, cln, fc, coordCreds, nil) }()

	creds := t.TempDir()
	if err := issue(t, ca, "n1", pki.Agent, localhost).Write(creds); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{
		Creds:       creds,
		Container:   container.Options{DataDir: env.DataDir, StagingDir: env.StagingDir, Bridge: env.Bridge},
		Listen:      "127.0.0.1:0",
		Coordinator: cln.Addr().String(),
		Underlay:    netip.MustParseAddr("127.0.0.1"),
		Labels:      map[string]string{"rack": "r1"},
		Health:      agent.HealthConfig{Every: 20 * time.Millisecond},
		ToolsDir:    t.TempDir(),
		Exe:         os.Args[0],
	})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(ctx) }()

	testutil.WaitUntil(t, 10*time.Second, func() (bool, string) {
		joins, heartbeats := fc.seen()
		return len(joins) >= 2 && heartbeats >= 2, "the agent did not join, join again and send heartbeats"
	})
	joins, _ := fc.seen()
	cpu, err := cpufeat.Read()
	if err != nil || len(cpu) == 0 {
		t.Fatalf("this machine's CPU features: %v %v", cpu, err)
	}
	want := coordv1.Join{Name: "n1", Addr: a.Addr().String(), Underlay: "127.0.0.1", Labels: map[string]string{"rack": "r1"},
		API: coordv1.APIVersion, Version: version.Get().Version, CPU: cpu}
	for _, j := range joins {
		got, _ := json.Marshal(j)
		exp, _ := json.Marshal(want)
		if string(got) != string(exp) {
			t.Errorf("join %s, want %s", got, exp)
		}
	}
	c := rpc.NewAgentClient(a.Addr().String(), "n1", coordCreds)
	defer c.Close()
	if h, err := c.Health(ctx); err != nil || h.Node != "n1" {
		t.Errorf("health: %+v %v", h, err)
	}
	cancel()
	for _, done := range []chan error{runDone, coordDone} {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("after the context ended: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("still serving 10s after the context ended")
		}
	}
}
