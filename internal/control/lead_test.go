package control_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/control"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// TestStandby: of two coordinators on one catalog, the first leads and
// the second stands by, sending clients to the leader; a client given
// both reaches the leader through either. When the leader stops, the
// standby takes over with a newer term, and the same client follows.
func TestStandby(t *testing.T) {
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := catalog.StartEmbedded(t.Context(), catalog.EmbeddedOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	coordCreds := creds(t, ca, rpc.CoordServerName, pki.Coordinator, net.ParseIP("127.0.0.1"))
	start := func(name string) (addr string, stop func()) {
		cfg := control.Config{Creds: coordCreds, Dir: t.TempDir(), Listen: freeAddr(t), Name: name,
			Etcd: catalog.Config{Endpoints: e.Endpoints()}}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- control.Run(ctx, cfg) }()
		var once bool
		stop = func() {
			if once {
				return
			}
			once = true
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run %s: %v", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s still running 30s after its context ended", name)
			}
		}
		t.Cleanup(stop)
		return cfg.Listen, stop
	}
	cli, err := pki.LoadCredentials(creds(t, ca, "cli", pki.Client))
	if err != nil {
		t.Fatal(err)
	}
	leaderOf := func(addrs string) coordv1.Coordinator {
		t.Helper()
		c := rpc.NewCoordClient(addrs, cli)
		defer c.Close()
		deadline := time.Now().Add(30 * time.Second)
		for {
			list, err := c.Coordinators(t.Context())
			for _, co := range list {
				if co.Leader {
					return co
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no leader among %v (%v)", list, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	a1, stop1 := start("c1")
	first := leaderOf(a1)
	if first.Name != "c1" || first.Addr != a1 || first.Term == "" {
		t.Fatalf("leader %+v, want c1 at %s with a term", first, a1)
	}
	a2, _ := start("c2")
	// The standby answers with the leader's address, and nothing else.
	raw := rpc.New(a2, rpc.CoordServerName, cli, 10*time.Second)
	defer raw.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := raw.Do(t.Context(), http.MethodGet, coordv1.PathJobs, nil, nil)
		var ae *agentv1.Error
		if errors.As(err, &ae) && ae.Code == coordv1.CodeNotLeader {
			if !strings.Contains(ae.Message, a1) {
				t.Errorf("the standby's answer does not give the leader's address %s: %s", a1, ae.Message)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby answered %v, want %s", err, coordv1.CodeNotLeader)
		}
		time.Sleep(50 * time.Millisecond)
	}
	both := rpc.NewCoordClient(a2+","+a1, cli)
	defer both.Close()
	if _, err := both.Jobs(t.Context()); err != nil {
		t.Fatalf("jobs through the standby first: %v", err)
	}
	if list, err := both.Coordinators(t.Context()); err != nil || len(list) != 2 {
		t.Fatalf("coordinators: %v, %v; want c1 and c2", list, err)
	}

	stop1()
	second := leaderOf(a1 + "," + a2)
	if second.Name != "c2" {
		t.Fatalf("after c1 stopped the leader is %+v, want c2", second)
	}
	t1, _ := agentv1.ParseTerm(first.Term)
	t2, err := agentv1.ParseTerm(second.Term)
	if err != nil || !t1.Older(t2) {
		t.Errorf("c2's term %s is not newer than c1's %s", second.Term, first.Term)
	}
	if _, err := both.Jobs(t.Context()); err != nil {
		t.Fatalf("jobs after the take-over: %v", err)
	}
}
