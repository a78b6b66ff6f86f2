package control_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn/internal/control"
	"cairn/internal/pki"
	"cairn/internal/rpc"
)

func creds(t *testing.T, ca *pki.CA, name string, role pki.Role, ips ...net.IP) string {
	t.Helper()
	c, err := ca.Issue(name, role, pki.IssueOptions{IPs: ips})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := c.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// freeAddr is a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRun: a coordinator runs on an embedded etcd in its state dir, keeps
// its events there, answers clients, and stops when its context ends; it
// runs only with the coordinator's credentials.
func TestRun(t *testing.T) {
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := control.Config{Creds: creds(t, ca, "someone", pki.Client), Dir: dir, Listen: freeAddr(t)}
	if err := control.Run(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "not the coordinator") {
		t.Fatalf("client credentials: %v", err)
	}

	cfg.Creds = creds(t, ca, rpc.CoordServerName, pki.Coordinator, net.ParseIP("127.0.0.1"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- control.Run(ctx, cfg) }()

	cli, err := pki.LoadCredentials(creds(t, ca, "cli", pki.Client))
	if err != nil {
		t.Fatal(err)
	}
	c := rpc.NewCoordClient(cfg.Listen, cli)
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		h, err := c.Health(ctx)
		if err == nil {
			if h.Etcd != "embedded" || h.Cluster != ca.ClusterID {
				t.Errorf("health %+v", h)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the coordinator never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, p := range []string{"etcd", "events.jsonl"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("state dir: %v", err)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30s after its context ended")
	}
}
