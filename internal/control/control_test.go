package control_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/control"
	"github.com/cairn-hpc/cairn/internal/dashboard"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
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

// TestRunDashboard: with a token file, the dashboard is served on its own
// loopback port to callers with the token, and to nobody else; a port off
// the loopback, or a token file others may read, is refused before
// anything starts.
func TestRunDashboard(t *testing.T) {
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(t.TempDir(), "ui-token")
	if err := os.WriteFile(token, []byte("a-token-for-the-dashboard\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := control.Config{Creds: creds(t, ca, rpc.CoordServerName, pki.Coordinator, net.ParseIP("127.0.0.1")), Dir: t.TempDir(),
		Listen: freeAddr(t), UITokenFile: token, UIListen: "0.0.0.0:0"}
	if err := control.Run(t.Context(), cfg); !errors.Is(err, dashboard.ErrNotLoopback) {
		t.Fatalf("dashboard on 0.0.0.0: %v", err)
	}
	open := filepath.Join(t.TempDir(), "ui-token")
	if err := os.WriteFile(open, []byte("a-token-for-the-dashboard\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.UIListen, cfg.UITokenFile = freeAddr(t), open
	if err := control.Run(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Fatalf("a token file others may read: %v", err)
	}

	cfg.UITokenFile = token
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- control.Run(ctx, cfg) }()
	get := func(auth string) (int, string) {
		req, err := http.NewRequest("GET", "http://"+cfg.UIListen+"/ui/api/cluster", nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		status, body := get("Bearer a-token-for-the-dashboard")
		if status == http.StatusOK {
			if !strings.Contains(body, ca.ClusterID) {
				t.Errorf("dashboard: %s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dashboard never answered: %d %s", status, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if status, body := get(""); status != http.StatusUnauthorized {
		t.Errorf("without the token: %d %s", status, body)
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
