package agent_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/agent"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

type cluster struct {
	ca   *pki.CA
	addr string
}

func issue(t *testing.T, ca *pki.CA, name string, role pki.Role, ips ...net.IP) *pki.Credentials {
	t.Helper()
	c, err := ca.Issue(name, role, pki.IssueOptions{IPs: ips})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startAgent serves a test env's Manager on 127.0.0.1 with agent n1's
// credentials until the test ends.
func startAgent(t *testing.T) (*cluster, *testutil.Env) {
	t.Helper()
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr, env := startAgentAs(t, ca, "n1")
	return &cluster{ca: ca, addr: addr}, env
}

// startAgentAs serves a new test env's Manager on 127.0.0.1 as agent
// name of ca's cluster until the test ends, and returns its address.
func startAgentAs(t *testing.T, ca *pki.CA, name string) (string, *testutil.Env) {
	t.Helper()
	env := testutil.NewEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	srv := &agent.Server{Manager: env.Manager, Creds: issue(t, ca, name, pki.Agent, net.ParseIP("127.0.0.1"))}
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), env
}

func apiErr(t *testing.T, err error, code string) {
	t.Helper()
	var e *agentv1.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("error %v, want API error %s", err, code)
	}
}

// TestAgentAPI drives a container's life through the agent API as the
// coordinator would.
func TestAgentAPI(t *testing.T) {
	cl, _ := startAgent(t)
	ctx := context.Background()
	c := rpc.NewAgentClient(cl.addr, "n1", issue(t, cl.ca, "coord", pki.Coordinator))
	defer c.Close()

	h, err := c.Health(ctx)
	if err != nil || h.Node != "n1" || h.Version != "v1" || h.CRIU == "" {
		t.Fatalf("health: %+v %v", h, err)
	}
	bin := testutil.CairnBinary(t)
	ct, err := c.Run(ctx, agentv1.RunRequest{Name: "r0", Args: []string{bin, "stateapp", "-no-stream", "-dir", "/var/lib/stateapp"}})
	if err != nil || ct.Status != agentv1.StatusRunning || ct.Addr == "" {
		t.Fatalf("run: %+v %v", ct, err)
	}
	_, err = c.Run(ctx, agentv1.RunRequest{Name: "r0", Args: []string{"true"}})
	apiErr(t, err, agentv1.CodeExists)
	_, err = c.Run(ctx, agentv1.RunRequest{Name: "../x", Args: []string{"true"}})
	apiErr(t, err, agentv1.CodeBadRequest)
	_, err = c.Get(ctx, "ghost")
	apiErr(t, err, agentv1.CodeNotFound)

	time.Sleep(300 * time.Millisecond)
	ck, err := c.Checkpoint(ctx, agentv1.CheckpointRequest{Name: "r0"})
	if err != nil || ck.Seq != 1 || ck.Size == 0 || ck.Stall <= 0 {
		t.Fatalf("checkpoint: %+v %v", ck, err)
	}
	cks, err := c.Checkpoints(ctx, "r0")
	if err != nil || len(cks) != 1 {
		t.Fatalf("checkpoints: %v %v", cks, err)
	}
	_, err = c.Restore(ctx, agentv1.RestoreRequest{Name: "r0"})
	apiErr(t, err, agentv1.CodeRunning)
	if err := c.Remove(ctx, "r0", true); err != nil {
		t.Fatal(err)
	}
	ct, err = c.Restore(ctx, agentv1.RestoreRequest{Name: "r0"})
	if err != nil || ct.Status != agentv1.StatusRunning || ct.RestoredFrom != "r0:1" {
		t.Fatalf("restore: %+v %v", ct, err)
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := c.Remove(ctx, "r0", true); err != nil {
		t.Fatal(err)
	}
}

// TestAgentRefusesStrangers: no credentials, another cluster's, or the
// wrong role get nothing.
func TestAgentRefusesStrangers(t *testing.T) {
	cl, _ := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// A CLI client of this cluster may call.
	ok := rpc.NewAgentClient(cl.addr, "n1", issue(t, cl.ca, "cli", pki.Client))
	defer ok.Close()
	if _, err := ok.Health(ctx); err != nil {
		t.Fatalf("client of the cluster: %v", err)
	}

	// Another agent may not.
	peer := rpc.NewAgentClient(cl.addr, "n1", issue(t, cl.ca, "n2", pki.Agent))
	defer peer.Close()
	_, err := peer.Health(ctx)
	apiErr(t, err, agentv1.CodeForbidden)

	// Another cluster's coordinator cannot even connect.
	other, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stranger := rpc.NewAgentClient(cl.addr, "n1", issue(t, other, "coord", pki.Coordinator))
	defer stranger.Close()
	if _, err := stranger.Health(ctx); err == nil {
		t.Fatal("a coordinator of another cluster was let in")
	} else if apiE := (*agentv1.Error)(nil); errors.As(err, &apiE) {
		t.Fatalf("another cluster got an API answer: %v", err)
	}

	// No client certificate at all.
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 10 * time.Second}
	resp, err := plain.Get("https://" + cl.addr + agentv1.PathHealth)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a client without a certificate got HTTP %d", resp.StatusCode)
	}
	if !strings.Contains(err.Error(), "certificate") && !strings.Contains(err.Error(), "tls") {
		t.Logf("refused with: %v", err)
	}
}

// TestAgentRefusesHostileNames: names and numbers that would build paths
// outside the node's data dir are refused as bad requests by every API
// call that takes them, and nothing is created for them.
func TestAgentRefusesHostileNames(t *testing.T) {
	cl, env := startAgent(t)
	ctx := context.Background()
	c := rpc.NewAgentClient(cl.addr, "n1", issue(t, cl.ca, "coord", pki.Coordinator))
	defer c.Close()
	for _, bad := range []string{"../../x", "/abs", "..", "a/b"} {
		calls := map[string]func() error{
			"run":        func() error { _, err := c.Run(ctx, agentv1.RunRequest{Name: bad, Args: []string{"true"}}); return err },
			"get":        func() error { _, err := c.Get(ctx, bad); return err },
			"remove":     func() error { return c.Remove(ctx, bad, true) },
			"checkpoint": func() error { _, err := c.Checkpoint(ctx, agentv1.CheckpointRequest{Name: bad}); return err },
			"restore":    func() error { _, err := c.Restore(ctx, agentv1.RestoreRequest{Name: bad}); return err },
			"restore as": func() error { _, err := c.Restore(ctx, agentv1.RestoreRequest{Name: "x", As: bad}); return err },
			"ckpts":      func() error { _, err := c.Checkpoints(ctx, bad); return err },
			"kill":       func() error { return c.Kill(ctx, bad, 9) },
			"prepare": func() error {
				_, err := c.Prepare(ctx, agentv1.Prepare{Rank: agentv1.Rank{Job: bad}, Seq: 1})
				return err
			},
			"drop": func() error { _, err := c.DropImages(ctx, agentv1.DropImages{Containers: []string{bad}}); return err },
		}
		for what, call := range calls {
			var e *agentv1.Error
			if err := call(); !errors.As(err, &e) || e.Code != agentv1.CodeBadRequest {
				t.Errorf("%s %q: %v, want %s", what, bad, err, agentv1.CodeBadRequest)
			}
		}
	}
	if _, err := c.Prepare(ctx, agentv1.Prepare{Rank: agentv1.Rank{Job: "j"}, Seq: -1}); err == nil {
		t.Error("prepare of checkpoint -1 accepted")
	}
	locks, _ := os.ReadDir(filepath.Join(env.DataDir, "locks"))
	if len(locks) != 0 {
		t.Errorf("lock files left for names that do not exist: %v", locks)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(env.DataDir), "x.lock")); err == nil {
		t.Error("x.lock made outside the data dir")
	}
}
