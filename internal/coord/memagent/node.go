package memagent

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
)

// Node is one in-memory agent and what it holds.
type Node struct {
	c        *Cluster
	name     string
	addr     string
	underlay string
	cpu      []string // the CPU features it joins with; set before it joins

	mu      sync.Mutex
	up      bool
	ctrs    map[string]*Container // by name, JOB.RANK
	images  map[imageKey]bool     // complete images in the node's store
	damaged map[imageKey]bool     // images whose copy here is damaged
	pending map[imageKey]*prepared
	// aborted are the aborts that found nothing prepared, with when they
	// came: a prepare of one yet to come gives its rank up.
	aborted map[imageKey]time.Time
	nets    map[uint32]agentv1.JobNet
	term    agentv1.Term // the newest coordinator term that called (TermHeader)
}

func (n *Node) alive() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.up
}

// Name returns the node's name.
func (n *Node) Name() string { return n.name }

// Alive reports whether the node is up (Cluster.Kill ends that).
func (n *Node) Alive() bool { return n.alive() }

// Exit ends a rank's processes by themselves, with exit status code, as a
// program that returns does; false if the node holds no such container.
func (n *Node) Exit(name string, code int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	ct := n.ctrs[name]
	if ct == nil {
		return false
	}
	ct.stopHold()
	ct.Status, ct.Locked, ct.ExitCode, ct.frozenEnded = agentv1.StatusExited, false, code, ""
	return true
}

// ended lists the rank containers whose processes have ended, as the
// real agent reports them with its heartbeats.
func (n *Node) ended() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for name, ct := range n.ctrs {
		if ct.Status == agentv1.StatusExited {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// live lists the node's containers that have not ended, as a heartbeat
// reports them.
func (n *Node) live() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for name, ct := range n.ctrs {
		if ct.Status.Live() {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// drop stops the named containers, as a heartbeat's reply asks (their
// output kept), as the real agent does.
func (n *Node) drop(names []string) {
	if len(names) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.up {
		return
	}
	for _, name := range names {
		n.remove(name, true)
	}
}

// SetCPU sets the CPU features the node reports when it joins (next).
func (n *Node) SetCPU(cpu []string) {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	n.cpu = cpu
}

// join is what the node sends to join.
func (n *Node) join() coordv1.Join {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	return coordv1.Join{Name: n.name, Addr: n.addr, Underlay: n.underlay, CPU: n.cpu}
}

// Underlay returns the node's underlay address, as it joins.
func (n *Node) Underlay() string { return n.underlay }

// Addr returns the address of the node's agent, as it joins.
func (n *Node) Addr() string { return n.addr }

// Container returns the node's container name, if it has one.
func (n *Node) Container(name string) (Container, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ct := n.ctrs[name]
	if ct == nil {
		return Container{}, false
	}
	return *ct, true
}

type imageKey struct {
	name string
	seq  int
}

// Container is the model of a rank's container on a node.
type Container struct {
	Name   string
	Job    string
	Rank   int
	Addr   string
	Status agentv1.Status // running, paused (frozen), stopped or exited
	// ExitCode is how an exited container ended: its exit status, or
	// 128 and the signal that killed it.
	ExitCode int
	Locked   bool // its network drops everything
	Held     bool // stalled or moved in: a hold runs
	// RestoredFrom is the checkpoint it was restored from (0: it was
	// started, or moved in).
	RestoredFrom int
	// Incarnation counts its runs on this node: 1 for the first start or
	// restore, one more for each restore that replaced it.
	Incarnation int
	hold        *time.Timer
	// frozenEnded is how a rank that had ended before a stall froze what
	// was left of it (it reads paused) ended: a thaw leaves it so.
	frozenEnded agentv1.Status
	// vni is the job network its address is on; attached says the address
	// is taken on this node (the real agent's rank network namespace):
	// from its start, restore or move in until it is removed.
	vni      uint32
	attached bool
}

func (ct *Container) stopHold() {
	if ct.hold != nil {
		ct.hold.Stop()
		ct.hold = nil
	}
	ct.Held = false
}

// prepared is a rank prepared for a checkpoint (or a move): frozen,
// locked, its image staged; thaw ends its hold, expire drops it.
type prepared struct {
	thaw, expire *time.Timer
}

func (p *prepared) stop() {
	for _, t := range []*time.Timer{p.thaw, p.expire} {
		if t != nil {
			t.Stop()
		}
	}
}

// rememberAbort notes an abort that found nothing prepared, for
// PendingTTL (the aborts older than that are forgotten now).
func (n *Node) rememberAbort(key imageKey) {
	now := time.Now()
	for k, at := range n.aborted {
		if now.Sub(at) > n.c.opts.PendingTTL {
			delete(n.aborted, k)
		}
	}
	n.aborted[key] = now
}

func apiErr(code, format string, args ...any) error {
	return &agentv1.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func notFound(name string) error { return apiErr(agentv1.CodeNotFound, "no container %s", name) }

func (n *Node) hold(d time.Duration) time.Duration {
	if d <= 0 {
		return n.c.opts.Hold
	}
	return d
}

// later runs fn under the node's lock after d, unless the node died.
func (n *Node) later(d time.Duration, fn func()) *time.Timer {
	return time.AfterFunc(d, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.up {
			fn()
		}
	})
}

func (n *Node) thaw(ct *Container) {
	switch {
	case ct.frozenEnded != "":
		ct.Status, ct.frozenEnded = ct.frozenEnded, ""
	case ct.Status == agentv1.StatusPaused:
		ct.Status = agentv1.StatusRunning
	}
	ct.Locked = false
}

// dropPending aborts the prepares of container name (thawing it).
func (n *Node) dropPending(name string) {
	for k, p := range n.pending {
		if k.name == name {
			p.stop()
			delete(n.pending, k)
			if ct := n.ctrs[name]; ct != nil {
				n.thaw(ct)
			}
		}
	}
}

// peek calls f with src locked instead of n, whose lock the caller holds:
// a node never holds another's lock with its own, or two calls between
// the same nodes in opposite directions (a copy each way) would wait for
// each other for good.
func (n *Node) peek(src *Node, f func()) {
	n.mu.Unlock()
	defer n.mu.Lock()
	src.mu.Lock()
	defer src.mu.Unlock()
	f()
}

// holder returns a node of holders that n reaches and that has a sound
// copy of key. Its error is n's answer (*agentv1.Error), as the real
// agent's is: of the code the first holder that answered gave (not_found
// for a copy it lacks, corrupt for a damaged one), internal if none did
// (this model's used to be no answer at all, which the coordinator takes
// for n unreachable).
func (n *Node) holder(key imageKey, holders []string) (*Node, error) {
	var errs []error
	code := ""
	for _, h := range holders {
		if h == n.name {
			continue
		}
		src, ok := n.c.reachable(n.name, h)
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %w", h, ErrUnreachable))
			continue
		}
		var up, has, damaged bool
		n.peek(src, func() { up, has, damaged = src.up, src.images[key], src.damaged[key] })
		if up && has && !damaged {
			return src, nil
		}
		errs = append(errs, fmt.Errorf("%s has no sound copy of %s:%d", h, key.name, key.seq))
		switch {
		case code != "" || !up:
		case has:
			code = agentv1.CodeCorrupt
		default:
			code = agentv1.CodeNotFound
		}
	}
	if code == "" {
		code = agentv1.CodeInternal
	}
	if len(errs) == 0 {
		return nil, apiErr(code, "no holder of %s:%d", key.name, key.seq)
	}
	return nil, &agentv1.Error{Code: code, Message: errors.Join(errs...).Error()}
}
