package coord_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// A chaos run (seed 49) that ended "automatic restart gave up": n5,
// which ran rank 1, missed heartbeats while the coordinator stalled, and
// its lease lapsed for a moment; the restart that followed (n4, rank 0's
// node, just killed, still alive by its lease) planned without n5, so
// liveLeftover left n5 out of rank 1's leftover, and the record kept it
// out. n5 came back at once with rank 1 still attached to its job bridge;
// the next attempts placed rank 0 on n5 and rank 1 elsewhere, never
// removed rank 1 from n5, and n5's agent refused the restore: "rank
// 10.236.208.3 is attached to this node (bridge port r0000010aecd003),
// not remote", attempt after attempt.

// lapseGate stands between the in-memory nodes and the coordinator for
// their joins and heartbeats: a node's heartbeats can be held back, so
// that its lease lapses while it lives on with what it holds, then let
// through again (it joins again, "node came back after its lease
// expired").
type lapseGate struct {
	memagent.Joiner
	mu   sync.Mutex
	held map[string]bool
}

func (g *lapseGate) hold(node string, held bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held[node] = held
}

func (g *lapseGate) Heartbeat(ctx context.Context, hb coordv1.Heartbeat) (*coordv1.HeartbeatReply, error) {
	g.mu.Lock()
	held := g.held[hb.Name]
	g.mu.Unlock()
	if held {
		return nil, errors.New("heartbeat lost: context deadline exceeded")
	}
	return g.Joiner.Heartbeat(ctx, hb)
}

// lapseEnv is a memEnv of 4 nodes with a job of 2 ranks (one a node, 1 replica) on n0 and n1 and a
// protected checkpoint: rank 0's image on n0 and n1, rank 1's on n1 and
// n2.
func lapseEnv(t *testing.T) (*memEnv, *memCoord, *lapseGate, int) {
	t.Helper()
	e := newMemEnv(t, 4, memagent.Options{}, coord.Options{})
	c := e.start()
	g := &lapseGate{Joiner: c.Coordinator, held: map[string]bool{}}
	if err := e.mc.Join(e.ctx, g, memTTL/4); err != nil { // every node beats already: this only puts g between
		t.Fatal(err)
	}
	if _, err := c.RunJob(context.Background(), coordv1.RunJob{Name: "ring", Ranks: 2, PerNode: 1, Replicas: 1,
		Args: []string{"/bin/ring"}, Nodes: []string{"n0", "n1"}}); err != nil {
		t.Fatal(err)
	}
	seq := c.checkpoint(t, "ring", 1)
	for _, h := range []struct {
		node string
		rank int
	}{{"n0", 0}, {"n1", 0}, {"n1", 1}, {"n2", 1}} {
		if !e.mc.HasImage(h.node, agentv1.RankName("ring", h.rank), seq) {
			t.Fatalf("no copy of rank %d's image on %s: the scenario needs rank 0's on n0,n1 and rank 1's on n1,n2", h.rank, h.node)
		}
	}
	return e, c, g, seq
}

// ringJob returns the job's record.
func ringJob(t *testing.T, c *memCoord) coordv1.Job {
	t.Helper()
	jobs, err := c.Jobs(context.Background())
	if err != nil || len(jobs) != 1 {
		t.Fatalf("jobs: %+v %v", jobs, err)
	}
	return jobs[0]
}

// lapse holds node's heartbeats back until the coordinator finds it
// dead; its rank ends meanwhile (the ring lost its peer), so no heartbeat
// lists it live (a live one would be stopped as a stray).
func lapse(t *testing.T, e *memEnv, c *memCoord, g *lapseGate, node string, rank int) {
	t.Helper()
	g.hold(node, true)
	if !e.mc.Node(node).Exit(agentv1.RankName("ring", rank), 1) {
		t.Fatalf("%s holds no rank %d", node, rank)
	}
	waitFor(t, 10*time.Second, node+" found dead", func() bool {
		nodes, err := c.Nodes(context.Background())
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if n.Name == node {
				return !n.Alive
			}
		}
		return false
	})
}

// back lets node's heartbeats through again, and waits until it is alive.
func back(t *testing.T, c *memCoord, g *lapseGate, node string) {
	t.Helper()
	g.hold(node, false)
	waitFor(t, 10*time.Second, node+" alive again", func() bool {
		nodes, err := c.Nodes(context.Background())
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if n.Name == node {
				return n.Alive
			}
		}
		return false
	})
}

// runsAgain waits until the job runs after restarts restarts, or the
// automatic restart gives up, and checks it runs consistent.
func runsAgain(t *testing.T, e *memEnv, c *memCoord, restarts, seq int) {
	t.Helper()
	var j coordv1.Job
	waitFor(t, 60*time.Second, "the job running again, or its restart given up", func() bool {
		j = ringJob(t, c)
		return j.State == coordv1.JobRunning && j.Restarts == restarts ||
			j.State == coordv1.JobFailed && strings.Contains(j.Reason, "gave up")
	})
	if j.State != coordv1.JobRunning {
		t.Fatalf("job %s on %v, leftover %v: %s (%s)\nthe nodes hold:\n%s", j.State, j.Placement, j.Leftover, j.Reason,
			"the leftover forgot the node whose lease lapsed", e.mc.Describe("ring"))
	}
	if err := e.consistent(&j, seq); err != nil {
		t.Fatal(err)
	}
}

// TestRestartRemovesLeftoverOfLapsedNode is the chaos run's sequence: n1
// (the chaos's n5, rank 1) lapses, and the restart that follows cannot
// remove rank 0 from n0 (the chaos's n4, killed, alive by its lease), so
// it fails; n0 is then lost, n1 is back, and the next attempts place rank
// 0 on n1 (its image's only live copy) and rank 1 on n2. They must remove
// rank 1 from n1 first: n1's agent refuses to take rank 1 as remote while
// it is attached there.
func TestRestartRemovesLeftoverOfLapsedNode(t *testing.T) {
	e, c, g, seq := lapseEnv(t)
	// The coordinator's calls to n0 fail from now on, while n0's lease
	// runs: the restart's removal of rank 0 there fails.
	e.mc.Partition("c1", "n0")
	lapse(t, e, c, g, "n1", 1)
	waitFor(t, 10*time.Second, "the restart after n1's loss", func() bool {
		j := ringJob(t, c)
		return j.State == coordv1.JobRestarting && j.RestartPhase != ""
	})
	// n0 dies for good during the attempt (the next goes without it), and
	// n1 comes back with what it held.
	e.mc.Kill("n0")
	back(t, c, g, "n1")
	runsAgain(t, e, c, 1, seq)
}

// TestRestartAfterLapseRemembersLeftover: a restart that succeeds while a
// node of the job is not alive cannot remove what the job left there; the
// node comes back with it, and the next restart must remove it before it
// restores another rank there.
func TestRestartAfterLapseRemembersLeftover(t *testing.T) {
	e, c, g, seq := lapseEnv(t)
	lapse(t, e, c, g, "n1", 1)
	var j coordv1.Job
	waitFor(t, 20*time.Second, "the restart after n1's loss", func() bool {
		j = ringJob(t, c)
		return j.State == coordv1.JobRunning && j.Restarts == 1
	})
	if !slicesEqual(j.Placement, []string{"n0", "n2"}) {
		t.Fatalf("restarted on %v, the scenario needs n0,n2", j.Placement)
	}
	back(t, c, g, "n1")
	e.mc.Kill("n0")
	runsAgain(t, e, c, 2, seq)
}

func slicesEqual(a, b []string) bool {
	return strings.Join(a, ",") == strings.Join(b, ",")
}
