package coord_test

import (
	"context"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
	"github.com/cairn-hpc/cairn/internal/events"
)

// fetchGate counts the fetches of each image onto each node under way at
// once, and holds the first one until released.
type fetchGate struct {
	mu       sync.Mutex
	inFlight map[string]int
	most     int
	calls    int
	first    chan string // the first fetch's target, once it waits
	release  chan struct{}
}

type gatedAgent struct {
	coord.Agent
	node string
	g    *fetchGate
}

func (a gatedAgent) Fetch(ctx context.Context, req agentv1.Fetch) (agentv1.Image, error) {
	g := a.g
	key := a.node + " " + req.Container
	g.mu.Lock()
	g.calls++
	first := g.calls == 1
	g.inFlight[key]++
	g.most = max(g.most, g.inFlight[key])
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inFlight[key]--
		g.mu.Unlock()
	}()
	if first {
		g.first <- a.node
		select {
		case <-g.release:
		case <-ctx.Done():
			return agentv1.Image{}, ctx.Err()
		}
	}
	return a.Agent.Fetch(ctx, req)
}

// TestReplicationOnceAtATime: the repair that a node's loss starts, while
// a checkpoint's replication is still copying a rank, waits for that copy
// rather than fetching the same image onto the same node again beside it
// (which the test on real agents saw: two fetches of one image, one
// logged as a copy of 0 bytes from no one).
func TestReplicationOnceAtATime(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	g := &fetchGate{inFlight: map[string]int{}, first: make(chan string, 1), release: make(chan struct{})}
	e.wrap = func(node string, a coord.Agent) coord.Agent { return gatedAgent{a, node, g} }
	// Released however the test ends: a test that fails while the fetch
	// is held must not leave it holding the environment's shutdown.
	release := sync.OnceFunc(func() { close(g.release) })
	defer release()
	c := e.start()
	ctx := context.Background()
	if _, err := c.RunJob(ctx, coordv1.RunJob{Name: "solo", Ranks: 1, PerNode: 1, Replicas: 1, Args: []string{"/bin/solo"}, Nodes: []string{"n0"}}); err != nil {
		t.Fatal(err)
	}
	lost := c.Events().SubscribeNew(events.Filter{Type: evv1.NodeLost}, 4)
	// A coordinator watches for dying nodes two leases after it took
	// over; the node dies after that.
	time.Sleep(2*memTTL + 500*time.Millisecond)
	seq := c.checkpoint(t, "solo", 0)
	var target string
	select {
	case target = <-g.first:
	case <-time.After(10 * time.Second):
		t.Fatal("no replication of the checkpoint began")
	}
	other := map[string]string{"n1": "n2", "n2": "n1"}[target]
	if other == "" {
		t.Fatalf("the rank's copy went to %s, want n1 or n2", target)
	}
	// The third node's loss repairs every checkpoint: this one's copy to
	// target is the one its repair would make.
	e.mc.Kill(other)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if ev, ok := lost.Wait(wctx); !ok || ev.Node != other {
		t.Fatalf("node.lost: %+v (%v), want %s", ev, ok, other)
	}
	time.Sleep(time.Second) // the repair's turn
	release()
	waitFor(t, 10*time.Second, "the copy recorded", func() bool {
		cks, err := c.Checkpoints(ctx, "solo")
		return err == nil && len(cks) == 1 && cks[0].Seq == seq && cks[0].State == coordv1.CkptProtected
	})
	time.Sleep(500 * time.Millisecond) // a repair behind the copy ends
	g.mu.Lock()
	defer g.mu.Unlock()
	t.Logf("%d fetches in all", g.calls)
	if g.most != 1 {
		t.Errorf("%d fetches of the same image onto %s at once, want 1", g.most, target)
	}
}
