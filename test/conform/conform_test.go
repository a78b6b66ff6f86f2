package conform_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/agent"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/coord/agenttest"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestAgentConformance runs the agent's conformance suite against real
// agents: agent.Server on a container.Manager of its own per node, served
// from this process, each node a network namespace on an underlay bridge
// where its job networks are made, and ranks running a shell loop in
// runc containers checkpointed by CRIU.
func TestAgentConformance(t *testing.T) {
	testutil.RequiresRoot(t)
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	coord, err := ca.Issue("coord", pki.Coordinator, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agenttest.Run(t, agenttest.Env{
		Nodes:      func(t *testing.T) []agenttest.Node { return startNodes(t, ca, coord) },
		Args:       []string{"/bin/sh", "-c", "i=0; while :; do i=$((i+1)); echo $i; sleep 0.1; done"},
		Hold:       1500 * time.Millisecond,
		PendingTTL: pendingTTL,
		Settle:     10 * time.Second,
		Parallel:   true,
		Tier:       func(t *testing.T) string { return "file://" + t.TempDir() },
	})
}

// netMu makes the calls that set up job networks one at a time in this
// process. nftables numbers the sets of a VXLAN filter from one global
// counter, which an agent guards only for itself (its job network
// changes are serial): agents of one process would race on it.
var netMu sync.Mutex

// serialNets is an agent whose calls that set up job networks hold
// netMu.
type serialNets struct{ agenttest.Agent }

func (a serialNets) JobNet(ctx context.Context, req agentv1.JobNet) error {
	netMu.Lock()
	defer netMu.Unlock()
	return a.Agent.JobNet(ctx, req)
}

func (a serialNets) RankRun(ctx context.Context, req agentv1.RankRun) (agentv1.Container, error) {
	netMu.Lock()
	defer netMu.Unlock()
	return a.Agent.RankRun(ctx, req)
}

func (a serialNets) RankRestore(ctx context.Context, req agentv1.RankRestore) (agentv1.Container, error) {
	netMu.Lock()
	defer netMu.Unlock()
	return a.Agent.RankRestore(ctx, req)
}

func (a serialNets) MigrateIn(ctx context.Context, req agentv1.MigrateIn) (agentv1.MigratedIn, error) {
	netMu.Lock()
	defer netMu.Unlock()
	return a.Agent.MigrateIn(ctx, req)
}

// startNodes starts two agents, n1 and n2, on nodes made for t, which
// removes everything of them when it ends and checks that nothing is
// left.
func startNodes(t *testing.T, ca *pki.CA, coord *pki.Credentials) []agenttest.Node {
	t.Helper()
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	prefix := "cf" + hex.EncodeToString(b) + "-"
	cl, err := netw.NewCluster(prefix, netip.MustParsePrefix("10.219.0.0/24"), 2)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: the nodes go after their agents
	// have stopped and their containers are removed.
	out := &untilDone{w: t.Output()}
	t.Cleanup(out.done)
	t.Cleanup(func() { removeNodes(t, cl, prefix) })
	if err := cl.Create(context.Background()); err != nil {
		t.Fatal(err)
	}
	var nodes []agenttest.Node
	for i, n := range cl.Nodes {
		name := fmt.Sprintf("n%d", i+1)
		log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", name)
		env := testutil.NewEnv(t, func(o *container.Options) { o.Logger = log })
		creds, err := ca.Issue(name, pki.Agent, pki.IssueOptions{IPs: []net.IP{net.ParseIP("127.0.0.1")}})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &agent.Server{Manager: env.Manager, Creds: creds, Logger: log,
			Node: agent.Node{Netns: n.Name, Underlay: n.Addr, Dev: "eth0", NetnsPrefix: n.Name + "-"}}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, ln) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: serve: %v", name, err)
			}
		})
		c := rpc.NewTermAgentClient(ln.Addr().String(), name, coord, agentv1.Term{N: 1, Catalog: "conform"})
		t.Cleanup(c.Close)
		t.Cleanup(func() { removeRanks(t, name, c) })
		m := env.Manager
		nodes = append(nodes, agenttest.Node{Name: name, Addr: ln.Addr().String(), Underlay: n.Addr.String(), Agent: serialNets{c},
			Locked: func(ctx context.Context, ct string) (bool, error) { return locked(ctx, m, ct) }})
	}
	return nodes
}

// locked reports whether the network namespace of container name is
// locked; a namespace that is gone (the rank was detached) is not.
func locked(ctx context.Context, m *container.Manager, name string) (bool, error) {
	cfg, err := m.Config(name)
	if err != nil {
		return false, err
	}
	if cfg.Net == nil {
		return false, fmt.Errorf("%s has no network of its own", name)
	}
	if _, err := os.Stat(cfg.Net.Netns); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return netw.NetnsLocked(ctx, cfg.Net.Netns)
}

// removeRanks removes, through its agent, every rank container left on a
// node, whatever the suite did: a rank left prepared holds its container
// until the agent drops the prepare.
func removeRanks(t *testing.T, node string, c *rpc.AgentClient) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := c.List(ctx)
	if err != nil {
		t.Errorf("%s: list containers: %v", node, err)
		return
	}
	for _, ct := range list {
		job, r, ok := agentv1.ParseRankName(ct.Name)
		if !ok {
			continue
		}
		if err := c.RankRemove(ctx, agentv1.RankRemove{Rank: agentv1.Rank{Job: job, Rank: r}}); err != nil {
			t.Errorf("%s: remove %s: %v", node, ct.Name, err)
		}
	}
}

// removeNodes deletes the nodes, their underlay and every rank network
// namespace made on them, and checks that nothing named with prefix is
// left.
func removeNodes(t *testing.T, cl netw.Cluster, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.Delete(ctx); err != nil {
		t.Errorf("delete the nodes: %v", err)
	}
	if err := netw.Cleanup(ctx, prefix); err != nil {
		t.Errorf("delete the rank namespaces: %v", err)
	}
	if ents, err := os.ReadDir(netw.NetnsDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix) {
				t.Errorf("leaked netns %s", e.Name())
			}
		}
	}
	if ents, err := os.ReadDir("/sys/class/net"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix) {
				t.Errorf("leaked link %s", e.Name())
			}
		}
	}
}

// untilDone writes to w until done: the agents' timers may still log
// after their test has ended.
type untilDone struct {
	mu    sync.Mutex
	w     io.Writer
	ended bool
}

func (u *untilDone) Write(p []byte) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ended {
		return len(p), nil
	}
	return u.w.Write(p)
}

func (u *untilDone) done() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ended = true
}
