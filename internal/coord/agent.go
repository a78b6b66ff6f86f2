package coord

import (
	"context"
	"errors"
	"fmt"
	"sync"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"

	"golang.org/x/sync/singleflight"
)

// Agent is what the coordinator asks of a node's agent: the calls of
// api/agent/v1 it makes. rpc.AgentClient makes them over the wire;
// package coord/memagent answers them in memory, for tests and
// benchmarks of the coordinator's protocols. Methods may be called
// concurrently; an error of type *agentv1.Error is the agent's answer,
// any other means it was not reached (or did not answer).
type Agent interface {
	JobNet(ctx context.Context, req agentv1.JobNet) error
	DeleteJobNet(ctx context.Context, vni uint32) error
	RankRun(ctx context.Context, req agentv1.RankRun) (agentv1.Container, error)
	RankRestore(ctx context.Context, req agentv1.RankRestore) (agentv1.Container, error)
	RankResume(ctx context.Context, req agentv1.RankResume) error
	RankRemove(ctx context.Context, req agentv1.RankRemove) error
	RankStall(ctx context.Context, req agentv1.RankStall) error
	Prepare(ctx context.Context, req agentv1.Prepare) (agentv1.Prepared, error)
	Commit(ctx context.Context, req agentv1.Finish) (agentv1.Committed, error)
	Abort(ctx context.Context, req agentv1.Finish) error
	Fetch(ctx context.Context, req agentv1.Fetch) (agentv1.Image, error)
	MigrateIn(ctx context.Context, req agentv1.MigrateIn) (agentv1.MigratedIn, error)
	MigrateOut(ctx context.Context, req agentv1.MigrateOut) error
	DropImages(ctx context.Context, req agentv1.DropImages) (agentv1.Dropped, error)
	// The durable tier (api/agent/v1/tier.go).
	TierFlush(ctx context.Context, req agentv1.TierFlush) (agentv1.TierFlushed, error)
	TierFetch(ctx context.Context, req agentv1.TierFetch) (agentv1.Image, error)
	TierRecord(ctx context.Context, req agentv1.TierRecord) error
	TierRead(ctx context.Context, req agentv1.TierRead) (agentv1.TierRecord, error)
	TierPrune(ctx context.Context, req agentv1.TierPrune) (agentv1.TierPruned, error)
	Kill(ctx context.Context, name string, sig int) error
	Get(ctx context.Context, name string) (agentv1.Container, error)
	// Close releases the client's connections.
	Close()
}

var _ Agent = (*rpc.AgentClient)(nil)

// Dialer returns an Agent for a node as the catalog records it (its name
// and the address its agent serves on).
type Dialer func(n coordv1.Node, term agentv1.Term) Agent

// rpcDialer dials agents over the wire with creds, every call carrying
// the coordinator's term.
func rpcDialer(creds *pki.Credentials) Dialer {
	return func(n coordv1.Node, term agentv1.Term) Agent {
		return rpc.NewTermAgentClient(n.Addr, n.Name, creds, term)
	}
}

// fanOut calls fn for every item at once and joins the errors, each
// prefixed with what says which item it was.
func fanOut[T any](items []T, fn func(T) error, what func(T) string) error {
	var wg sync.WaitGroup
	errs := make([]error, len(items))
	for i, it := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(it); err != nil {
				errs[i] = fmt.Errorf("%s: %w", what(it), err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// agents keeps a client for each node's agent, every call of which
// carries the coordinator's term.
type agents struct {
	cat  *catalog.Catalog
	dial Dialer
	// term is the coordinator's, from the catalog at Start (fence.go):
	// set before the first call, never changed after.
	term agentv1.Term

	mu      sync.Mutex
	clients map[string]Agent // by node name
	dialing singleflight.Group
}

// client returns a client for the named node's agent.
func (g *agents) client(ctx context.Context, node string) (Agent, error) {
	// Cached: every RPC of a round goes through here, and a node's address
	// changes only when it joins again (which drops the cached client).
	g.mu.Lock()
	cl := g.clients[node]
	g.mu.Unlock()
	if cl != nil {
		return cl, nil
	}
	// One catalog read per node, however many ranks ask at once (a round
	// of 10,000 ranks on nodes not yet dialled).
	v, err, _ := g.dialing.Do(node, func() (any, error) {
		var n coordv1.Node
		if _, err := g.cat.Get(ctx, nodeKey(node), &n); err != nil {
			return nil, fmt.Errorf("node %s: %w", node, err)
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if cl := g.clients[node]; cl != nil {
			return cl, nil
		}
		cl := g.dial(n, g.term)
		g.clients[node] = cl
		return cl, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(Agent), nil
}

// forget drops a node's cached client: the node joined again, maybe at
// another address.
func (g *agents) forget(node string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if cl := g.clients[node]; cl != nil {
		cl.Close()
		delete(g.clients, node)
	}
}

// closeAll closes every client.
func (g *agents) closeAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, cl := range g.clients {
		cl.Close()
	}
	g.clients = map[string]Agent{}
}

// onNodes calls fn with the Agent of every node at once.
func (g *agents) onNodes(ctx context.Context, nodes []string, fn func(node string, a Agent) error) error {
	return fanOut(nodes, func(n string) error {
		a, err := g.client(ctx, n)
		if err != nil {
			return err
		}
		return fn(n, a)
	}, func(n string) string { return "node " + n })
}

// onRanks calls fn with the Agent of every rank's node of placement at
// once.
func (g *agents) onRanks(ctx context.Context, placement []string, fn func(rank int, a Agent) error) error {
	ranks := make([]int, len(placement))
	for r := range ranks {
		ranks[r] = r
	}
	return fanOut(ranks, func(r int) error {
		a, err := g.client(ctx, placement[r])
		if err != nil {
			return err
		}
		return fn(r, a)
	}, func(r int) string { return fmt.Sprintf("rank %d on %s", r, placement[r]) })
}
