// Package memagent is a cluster of node agents in memory, for tests and
// benchmarks of the coordinator's protocols: each node answers the calls
// of api/agent/v1 that the coordinator makes (coord.Agent) by changing a
// model of its rank containers (running, frozen, network locked, held),
// its prepared and stored rank images and its job networks, as the real
// agent (internal/agent) does, without containers, CRIU or a network.
// The agent's conformance suite (coord/agenttest) holds both to one
// contract: it runs against these nodes here and against real agents in
// test/conform, and where this model answered otherwise, it was made to
// answer as the real agent does (each such place says what it did).
//
// A Cluster also plays the network and the nodes' fates, as a test
// transport does (etcd-io/raft's rafttest network, hashicorp/raft's
// Partition): calls may be dropped before or after they are carried out,
// delayed, and refused between partitioned parties, all from a seeded
// source, so that a run can be replayed; a node may die (fail-stop: its
// containers and images are gone); a caller (a coordinator) may be cut
// off after its Nth call, as if it died there.
//
// Nodes join a coordinator and send it heartbeats (Cluster.Join), so that
// the coordinator's leases in etcd see them alive and dead as they would
// real agents.
package memagent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
)

// ErrUnreachable is the error of a call that did not reach its node, or
// whose reply did not come back: the coordinator cannot tell which.
var ErrUnreachable = errors.New("unreachable")

// Options configures a Cluster's network.
type Options struct {
	// Seed makes the drops and delays of a run repeatable.
	Seed uint64
	// Drop is the probability that a call is lost: half of the lost calls
	// are lost before the node sees them, half after it carried them out
	// (the reply is lost).
	Drop float64
	// Delay is the most a call waits before it reaches its node (evenly
	// spread from 0).
	Delay time.Duration
	// Hold is how long a node keeps a rank stalled, prepared or moved in
	// when the request names no hold (the real agent's default is 30 s).
	Hold time.Duration
	// PendingTTL is how long, once its hold has ended, a node keeps the
	// image of a prepare nobody decided, and remembers an abort that found
	// nothing prepared (the real agent's agent.PendingTTL, 10 min, the
	// default).
	PendingTTL time.Duration
	// Record, if set, is told of every call a node carries out, as "OP
	// NODE WHAT" and ": ERROR" if it failed, while the node holds its
	// lock (tests print traces with it).
	Record func(caller, call string)
}

// Cluster is a set of in-memory nodes and the network between them and
// their callers. Its calls take no lock that all share but for reading:
// a round of 10,000 ranks calls at once, and what is measured then is
// the coordinator.
type Cluster struct {
	mu      sync.RWMutex
	opts    Options
	nodes   map[string]*Node
	callers map[string]*caller
	apart   map[[2]string]bool       // partitioned pairs, either order
	byOp    map[string]*atomic.Int64 // calls carried out, by operation
	joiner  Joiner                   // the coordinator nodes report to
	beating map[string]chan struct{} // heartbeat loops, closed to stop them
	tiersMu sync.Mutex               // a lock of its own: taken under a node's
	tiers   map[string]*memTier      // the durable tiers, by URL (tier.go)

	rngMu sync.Mutex
	rng   *rand.Rand
}

type cutPoint struct {
	after int
	then  func()
}

// caller is what the network knows of one caller (a coordinator).
type caller struct {
	calls atomic.Int64
	cut   atomic.Bool // cut off
	mu    sync.Mutex
	at    *cutPoint // cut off after a number of calls
	hook  *callHook // run after a number of calls
}

// callHook runs fn with the node of a caller's call number after, once
// the node has carried it out (AfterCall).
type callHook struct {
	after int
	fn    func(node string)
}

// New returns an empty cluster.
func New(opts Options) *Cluster {
	if opts.Hold <= 0 {
		opts.Hold = 30 * time.Second
	}
	if opts.PendingTTL <= 0 {
		opts.PendingTTL = 10 * time.Minute
	}
	byOp := map[string]*atomic.Int64{}
	for _, op := range ops {
		byOp[op] = new(atomic.Int64)
	}
	return &Cluster{
		opts: opts, rng: rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		nodes: map[string]*Node{}, callers: map[string]*caller{}, apart: map[[2]string]bool{}, byOp: byOp,
		beating: map[string]chan struct{}{},
	}
}

// AddNode adds a live node, with its underlay address 10.0.x.y.
func (c *Cluster) AddNode(name string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := len(c.nodes) + 1
	n := &Node{c: c, name: name, addr: fmt.Sprintf("mem-%s:7420", name), underlay: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), up: true,
		ctrs: map[string]*Container{}, images: map[imageKey]bool{}, pending: map[imageKey]*prepared{}, aborted: map[imageKey]time.Time{},
		nets: map[uint32]agentv1.JobNet{}}
	c.nodes[name] = n
	return n
}

// SetNetwork changes the probability that a call is lost and the most it
// waits (Options.Drop and Delay) from now on.
func (c *Cluster) SetNetwork(drop float64, delay time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opts.Drop, c.opts.Delay = drop, delay
}

// Node returns the named node, or nil.
func (c *Cluster) Node(name string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[name]
}

// Nodes returns the nodes' names, sorted.
func (c *Cluster) Nodes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.nodes))
	for n := range c.nodes {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Kill stops a node for good, fail-stop: it answers nothing, sends no
// more heartbeats, and its containers, images and networks are gone.
func (c *Cluster) Kill(name string) {
	c.mu.Lock()
	n := c.nodes[name]
	if stop := c.beating[name]; stop != nil {
		close(stop)
		delete(c.beating, name)
	}
	c.mu.Unlock()
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.up = false
	for _, ct := range n.ctrs {
		ct.stopHold()
	}
	for _, p := range n.pending {
		p.stop()
	}
	n.ctrs, n.images, n.pending, n.nets = map[string]*Container{}, map[imageKey]bool{}, map[imageKey]*prepared{}, map[uint32]agentv1.JobNet{}
	n.aborted = map[imageKey]time.Time{}
}

// Partition cuts the network between a and b, which name nodes or
// callers; Heal joins them again.
func (c *Cluster) Partition(a, b string) { c.setApart(a, b, true) }

// Heal undoes Partition.
func (c *Cluster) Heal(a, b string) { c.setApart(a, b, false) }

func (c *Cluster) setApart(a, b string, apart bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a > b {
		a, b = b, a
	}
	if apart {
		c.apart[[2]string{a, b}] = true
	} else {
		delete(c.apart, [2]string{a, b})
	}
}

// ops are the operations a node carries out, as Ops counts them.
var ops = []string{"jobnet", "drop-jobnet", "run", "restore", "resume", "remove", "stall", "prepare", "commit", "abort",
	"fetch", "move-in", "move-out", "drop-images", "kill", "get", "tier-flush", "tier-fetch", "tier-record", "tier-read", "tier-prune"}

func (c *Cluster) caller(name string) *caller {
	c.mu.RLock()
	cs := c.callers[name]
	c.mu.RUnlock()
	if cs != nil {
		return cs
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cs = c.callers[name]; cs == nil {
		cs = &caller{}
		c.callers[name] = cs
	}
	return cs
}

// Cut cuts caller off: its calls fail from now on, as if it had died.
func (c *Cluster) Cut(caller string) { c.caller(caller).cut.Store(true) }

// CutAfter cuts caller off once n more of its calls have been carried
// out, and runs then (say, to close the dead coordinator's catalog) before
// the nth call's reply is lost.
func (c *Cluster) CutAfter(caller string, n int, then func()) {
	cs := c.caller(caller)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.at = &cutPoint{after: int(cs.calls.Load()) + n, then: then}
}

// AfterCall runs fn once the nth call of caller from now has been carried
// out, with the node that carried it out, before its reply returns: a
// fault injected right after a given step of a protocol (the node killed,
// cut off). Unlike CutAfter, the caller goes on.
func (c *Cluster) AfterCall(caller string, n int, fn func(node string)) {
	cs := c.caller(caller)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.hook = &callHook{after: int(cs.calls.Load()) + n, fn: fn}
}

// Calls returns how many calls caller has made.
func (c *Cluster) Calls(caller string) int { return int(c.caller(caller).calls.Load()) }

// Ops returns how many calls of each operation nodes carried out.
func (c *Cluster) Ops() map[string]int {
	out := map[string]int{}
	for op, n := range c.byOp {
		if v := n.Load(); v > 0 {
			out[op] = int(v)
		}
	}
	return out
}

// Client returns the client a caller (a coordinator, named caller) has
// of node's agent: what coord.Options.Dial returns.
func (c *Cluster) Client(caller, node string) *Client {
	return &Client{c: c, caller: caller, node: node}
}

// call carries op out on node for caller through the network: fn runs on
// the node, under its lock, unless the call is lost on the way or the
// node is down.
func (c *Cluster) call(ctx context.Context, caller, node, op, what string, fn func(n *Node) error) error {
	cs := c.caller(caller)
	nth := int(cs.calls.Add(1))
	c.mu.RLock()
	dead := cs.cut.Load() || c.apart[pair(caller, node)]
	n := c.nodes[node]
	drop, maxDelay, record := c.opts.Drop, c.opts.Delay, c.opts.Record
	c.mu.RUnlock()
	var delay time.Duration
	var lost, lostAfter bool
	if drop > 0 || maxDelay > 0 {
		c.rngMu.Lock()
		if maxDelay > 0 {
			delay = time.Duration(c.rng.Int64N(int64(maxDelay)))
		}
		lost = drop > 0 && c.rng.Float64() < drop
		lostAfter = lost && c.rng.IntN(2) == 0
		c.rngMu.Unlock()
	}
	if dead || n == nil {
		return fmt.Errorf("%s %s: %w", op, node, ErrUnreachable)
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if lost && !lostAfter {
		return fmt.Errorf("%s %s: request lost: %w", op, node, ErrUnreachable)
	}
	n.mu.Lock()
	if !n.up {
		n.mu.Unlock()
		return fmt.Errorf("%s %s: node down: %w", op, node, ErrUnreachable)
	}
	err := fn(n)
	if record != nil {
		line := op + " " + node
		if what != "" {
			line += " " + what
		}
		if err != nil {
			line += ": " + err.Error()
		}
		record(caller, line)
	}
	n.mu.Unlock()
	c.byOp[op].Add(1)
	cs.mu.Lock()
	cp := cs.at
	cutNow := cp != nil && nth >= cp.after && cs.cut.CompareAndSwap(false, true)
	if cutNow {
		cs.at = nil
	}
	hook := cs.hook
	if hook != nil && nth >= hook.after {
		cs.hook = nil
	} else {
		hook = nil
	}
	cs.mu.Unlock()
	if hook != nil {
		hook.fn(node)
	}
	if cutNow {
		if cp.then != nil {
			cp.then()
		}
		return fmt.Errorf("%s %s: caller cut off: %w", op, node, ErrUnreachable)
	}
	if lostAfter {
		return fmt.Errorf("%s %s: reply lost: %w", op, node, ErrUnreachable)
	}
	return err
}

func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// reachable reports whether node a reaches node b (a fetch, a move).
func (c *Cluster) reachable(a, b string) (*Node, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := c.nodes[b]
	return n, n != nil && !c.apart[pair(a, b)]
}

// Joiner is the coordinator's side of membership: coord.Coordinator.
type Joiner interface {
	Join(ctx context.Context, j coordv1.Join) (*coordv1.JoinReply, error)
	Heartbeat(ctx context.Context, hb coordv1.Heartbeat) (*coordv1.HeartbeatReply, error)
}

// Join has every live node join j and keep sending it heartbeats, every
// every, until the node dies or ctx ends; a node j no longer knows joins
// again. Calling Join again points the nodes at another coordinator (one
// that took over).
func (c *Cluster) Join(ctx context.Context, j Joiner, every time.Duration) error {
	c.mu.Lock()
	c.joiner = j
	var names []string
	for name, n := range c.nodes {
		if c.beating[name] == nil && n.alive() {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	c.mu.Unlock()
	for _, name := range names {
		n := c.Node(name)
		if _, err := j.Join(ctx, n.join()); err != nil {
			return fmt.Errorf("join %s: %w", name, err)
		}
		stop := make(chan struct{})
		c.mu.Lock()
		c.beating[name] = stop
		c.mu.Unlock()
		go c.heartbeats(ctx, n, every, stop)
	}
	return nil
}

func (c *Cluster) heartbeats(ctx context.Context, n *Node, every time.Duration, stop chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-t.C:
		}
		c.mu.Lock()
		j := c.joiner
		c.mu.Unlock()
		hctx, cancel := context.WithTimeout(ctx, every*2)
		rep, err := j.Heartbeat(hctx, coordv1.Heartbeat{Name: n.name, Ended: n.ended(), Live: n.live()})
		if err == nil {
			n.drop(rep.Drop)
		}
		var we *agentv1.Error
		if errors.As(err, &we) && we.Code == agentv1.CodeNotFound {
			_, _ = j.Join(hctx, n.join())
		}
		cancel()
	}
}

// RankView is what the nodes hold of one rank.
type RankView struct {
	Node string
	Container
}

// Ranks returns every container of job on every live node, by rank.
func (c *Cluster) Ranks(job string) map[int][]RankView {
	out := map[int][]RankView{}
	for _, name := range c.Nodes() {
		n := c.Node(name)
		n.mu.Lock()
		for _, ct := range n.ctrs {
			if ct.Job == job {
				out[ct.Rank] = append(out[ct.Rank], RankView{Node: name, Container: *ct})
			}
		}
		n.mu.Unlock()
	}
	return out
}

// JobNets returns the job network each live node holds for vni.
func (c *Cluster) JobNets(vni uint32) map[string]agentv1.JobNet {
	out := map[string]agentv1.JobNet{}
	for _, name := range c.Nodes() {
		n := c.Node(name)
		n.mu.Lock()
		if jn, ok := n.nets[vni]; ok {
			out[name] = jn
		}
		n.mu.Unlock()
	}
	return out
}

// HasImage reports whether node holds a complete copy of container's
// image of checkpoint seq in its store.
func (c *Cluster) HasImage(node, container string, seq int) bool {
	n := c.Node(node)
	if n == nil {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.images[imageKey{container, seq}]
}

// Damage marks node's copy of an image damaged: a restore from it is
// refused as corrupt until it is repaired.
func (c *Cluster) Damage(node, container string, seq int) {
	n := c.Node(node)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.damaged == nil {
		n.damaged = map[imageKey]bool{}
	}
	n.damaged[imageKey{container, seq}] = true
}

// Describe prints what the nodes hold of job, for test failures.
func (c *Cluster) Describe(job string) string {
	var b strings.Builder
	ranks := c.Ranks(job)
	keys := make([]int, 0, len(ranks))
	for r := range ranks {
		keys = append(keys, r)
	}
	slices.Sort(keys)
	for _, r := range keys {
		for _, v := range ranks[r] {
			fmt.Fprintf(&b, "r%d@%s %s", r, v.Node, v.Status)
			if v.Locked {
				b.WriteString(" locked")
			}
			if v.Held {
				b.WriteString(" held")
			}
			if v.RestoredFrom != 0 {
				b.WriteString(" restored-from=" + strconv.Itoa(v.RestoredFrom))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
