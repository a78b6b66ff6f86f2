// Self-fencing: a node cut off from the coordinators must not go on
// running ranks that a restart may bring back elsewhere with the same
// addresses. Once no coordinator has answered for half the node TTL
// (the lease expires after the whole TTL, and only then may a restart
// begin), the agent freezes every rank that runs here. When a
// coordinator answers again, the node reports the ranks it froze; the
// coordinator tells it which are still placed here (thawed) and which are
// not (stopped, their output kept), and leaves the others frozen while
// their jobs are busy, to be decided by a later heartbeat.

package agent

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
)

// selfFence freezes the node's ranks while no coordinator answers it.
type selfFence struct {
	s   *Server
	log *slog.Logger

	mu sync.Mutex
	// after is how long a silence may last before the ranks freeze: half
	// the node TTL a coordinator told; 0 until the node has joined.
	after  time.Duration
	heard  time.Time       // the last answer of a coordinator
	fenced map[string]bool // the ranks this fence froze, by name
}

func newSelfFence(s *Server, log *slog.Logger) *selfFence {
	return &selfFence{s: s, log: log, fenced: map[string]bool{}}
}

// joined takes the node TTL of a join's reply; a coordinator answered.
func (f *selfFence) joined(ttl time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.after, f.heard = ttl/2, time.Now()
}

// answered notes that a coordinator answered a heartbeat.
func (f *selfFence) answered() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.heard = time.Now()
}

// list is the ranks the fence holds frozen, for the heartbeat.
func (f *selfFence) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.fenced))
	for n := range f.fenced {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// silent reports whether no coordinator has answered for too long.
func (f *selfFence) silent() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.after > 0 && time.Since(f.heard) >= f.after
}

// watch freezes, while the node is silent, every rank that runs here
// (a rank thawed meanwhile, by a call of a coordinator that still reaches
// the node, is frozen again), until ctx ends.
func (f *selfFence) watch(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if f.silent() {
			f.freeze(ctx)
		}
	}
}

// freeze freezes the ranks that run here.
func (f *selfFence) freeze(ctx context.Context) {
	ins, err := f.s.Manager.List(ctx)
	if err != nil {
		f.log.Error("self-fence: list the ranks", "err", err)
		return
	}
	for _, in := range ins {
		if _, _, ok := agentv1.ParseRankName(in.Name); !ok || in.Status != container.StatusRunning {
			continue
		}
		if err := f.s.Manager.Pause(ctx, in.Name); err != nil {
			f.log.Error("self-fence: freeze a rank", "rank", in.Name, "err", err)
			continue
		}
		f.mu.Lock()
		f.fenced[in.Name] = true
		f.mu.Unlock()
		f.log.Warn("no coordinator answers: rank frozen until one says it is still this node's", "rank", in.Name)
	}
}

// settle does what a coordinator's answer says of the frozen ranks:
// thaw those still placed here, stop those that are not (their output
// kept). A name the fence does not hold is ignored.
func (f *selfFence) settle(ctx context.Context, release, drop []string) {
	for _, name := range release {
		if !f.holds(name) {
			continue
		}
		if err := f.s.Manager.Resume(ctx, name); err != nil && !errors.Is(err, container.ErrNotFound) {
			f.log.Error("self-fence: thaw a rank", "rank", name, "err", err)
			continue // asked again with the next heartbeat
		}
		f.let(name)
		f.log.Info("a coordinator answers again and the rank is still this node's: thawed", "rank", name)
	}
	for _, name := range drop {
		if !f.holds(name) {
			continue
		}
		job, rank, _ := agentv1.ParseRankName(name)
		err := f.s.rankRemove(ctx, agentv1.RankRemove{Rank: agentv1.Rank{Job: job, Rank: rank}, Keep: true})
		if err != nil {
			f.log.Error("self-fence: stop a rank placed elsewhere", "rank", name, "err", err)
			continue
		}
		f.let(name)
		f.log.Warn("a coordinator answers again, and the rank runs elsewhere now: stopped here", "rank", name)
	}
}

// holds reports whether the fence holds name frozen.
func (f *selfFence) holds(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fenced[name]
}

// let forgets name: the fence no longer holds it.
func (f *selfFence) let(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.fenced, name)
}
