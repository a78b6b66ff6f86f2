// Leadership among coordinators: each campaigns in the catalog's etcd
// election; the one that wins leads, fenced (every catalog write it makes
// holds only while it leads, every agent call carries its term), and the
// others stand by, answering clients with the leader's address.

package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/dashboard"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/service"
)

// coordinatorsPrefix holds, for each coordinator that runs, its
// coordv1.Coordinator, attached to its election session.
const coordinatorsPrefix = "coordinators/"

// leadership is one coordinator process: it campaigns, leads while it
// wins, and serves the API meanwhile (the coordinator's while it leads,
// the standby's answers otherwise).
type leadership struct {
	cfg     Config
	catCfg  catalog.Config
	cat     *catalog.Catalog // unfenced: the campaign and the listing
	creds   *pki.Credentials
	opts    coord.Options
	uiToken []byte
	log     *slog.Logger
	addr    string // the API's, as told to others

	leader  atomic.Pointer[leading] // nil while standing by
	started time.Time
	ended   sync.WaitGroup // terms whose catalog and clients are not closed yet
}

// leading is one term's coordinator, and the requests it serves.
type leading struct {
	co *coord.Coordinator
	// Each request the coordinator serves holds mu for reading; once the
	// term has ended, it is taken for writing before the term's catalog
	// and agent clients are closed.
	mu sync.RWMutex
}

// sessionTTL is how long a leader that stopped (died, paused, cut off
// from etcd) keeps its leadership: half a node's TTL, so that a standby
// takes over before the nodes' leases, which only the leader refreshes,
// run out.
func sessionTTL(nodeTTL time.Duration) time.Duration {
	if nodeTTL <= 0 {
		nodeTTL = coord.DefaultNodeTTL
	}
	return max(nodeTTL/2, 2*time.Second)
}

// run campaigns and leads, again after each leadership lost, until ctx
// ends, and returns once every term has closed its catalog and clients.
func (l *leadership) run(ctx context.Context) error {
	defer l.ended.Wait()
	l.started = time.Now().UTC()
	for ctx.Err() == nil {
		if err := l.term(ctx); err != nil && ctx.Err() == nil {
			l.log.Error("leadership", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// term is one candidacy: it stands by until it leads, then leads until the
// leadership is lost or ctx ends.
func (l *leadership) term(ctx context.Context) error {
	cand, err := l.cat.Candidate(ctx, sessionTTL(l.opts.NodeTTL))
	if err != nil {
		return err
	}
	defer cand.Close()
	me := l.record()
	if err := cand.Announce(ctx, coordinatorsPrefix+me.Name, me); err != nil {
		return err
	}
	l.log.Info("standing by for the leadership", "name", me.Name)
	service.Status("standing by for the leadership", l.log)
	key, rev, err := cand.Campaign(ctx, me.Name)
	if err != nil {
		return err
	}
	// The leader's own client, fenced: its writes hold only while this
	// leadership does, however late they reach etcd.
	cat, err := catalog.Open(ctx, l.catCfg)
	if err != nil {
		return err
	}
	cat.Fence(key, rev)
	lctx, depose := context.WithCancel(ctx)
	defer depose()
	go func() {
		select {
		case <-cand.Done():
			depose()
		case <-lctx.Done():
		}
	}()
	co := coord.New(cat, l.creds, l.log, l.opts)
	wait := co.Start(lctx)
	if co.Term().N == 0 {
		depose()
		wait()
		cat.Close()
		return errors.New("won the election but took no term from the catalog: standing by again")
	}
	me.Term, me.Since, me.Leader = co.Term().String(), time.Now().UTC(), true
	if err := cand.Announce(lctx, coordinatorsPrefix+me.Name, me); err != nil {
		l.log.Warn("announce the leadership", "err", err)
	}
	l.log.Info("leading", "name", me.Name, "term", me.Term)
	service.Status("leading the cluster, term "+me.Term, l.log)
	ld := &leading{co: co}
	l.leader.Store(ld)
	stopUI := l.serveUI(lctx, co)
	<-lctx.Done()
	l.leader.Store(nil)
	stopUI()
	// Requests still in flight finish with this term's catalog and agent
	// clients, which stay open for them (up to drainWait, or until the
	// process stops): whatever they would still change is refused by the
	// fences (their catalog writes, their agent calls), not cut short by a
	// closed connection. Then they are closed.
	l.ended.Add(1)
	go func() {
		defer l.ended.Done()
		drained := make(chan struct{})
		go func() { ld.mu.Lock(); ld.mu.Unlock(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(drainWait):
		case <-ctx.Done():
		}
		wait()
		cat.Close()
	}()
	if ctx.Err() == nil {
		l.log.Error("lost the leadership: standing by again", "name", me.Name, "term", me.Term)
	}
	return nil
}

// record is how this coordinator announces itself.
func (l *leadership) record() coordv1.Coordinator {
	host, _ := os.Hostname()
	addr := l.cfg.Advertise
	if addr == "" {
		addr = l.addr
	}
	return coordv1.Coordinator{Name: l.cfg.name(), Addr: addr, PID: os.Getpid(), Host: host, Started: l.started}
}

// serveUI serves the dashboard of co on its loopback port, if there is
// one, until the returned stop is called.
func (l *leadership) serveUI(ctx context.Context, co *coord.Coordinator) (stop func()) {
	if l.uiToken == nil {
		return func() {}
	}
	ln, err := net.Listen("tcp", l.cfg.UIListen)
	if err != nil {
		l.log.Error("dashboard", "err", err)
		return func() {}
	}
	ui := dashboard.New(dashboard.Config{Source: co, Events: l.opts.Events, Cluster: l.creds.ClusterID, WriteTimeout: l.opts.WriteTimeout, Logger: l.log})
	uctx, cancel := context.WithCancel(ctx)
	hs, err := dashboard.Server(uctx, ln, ui.Token(l.uiToken), l.log)
	if err != nil {
		cancel()
		ln.Close()
		l.log.Error("dashboard", "err", err)
		return func() {}
	}
	done := make(chan error, 1)
	go func() { done <- rpc.Run(uctx, hs, ln) }()
	l.log.Info("dashboard serving", "url", "http://"+ln.Addr().String()+dashboard.Prefix)
	return func() {
		cancel()
		if err := <-done; err != nil {
			l.log.Error("dashboard", "err", err)
		}
	}
}

// ServeHTTP serves the API: the coordinators' list whoever leads, the
// leader's API while this one leads, and otherwise the leader's address.
func (l *leadership) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if ld := l.leader.Load(); ld != nil && r.URL.Path != coordv1.PathCoordinators {
		ld.mu.RLock()
		defer ld.mu.RUnlock()
		ld.co.ServeHTTP(w, r)
		return
	}
	if _, ok := rpc.Caller(w, r); !ok {
		return
	}
	// A coordinator cut off from the catalog cannot tell who leads: it
	// says so soon, as one that does not lead, and the client asks
	// another.
	ctx, cancel := context.WithTimeout(r.Context(), catalogWait)
	defer cancel()
	if r.URL.Path == coordv1.PathCoordinators && r.Method == http.MethodGet {
		list, err := Coordinators(ctx, l.cat)
		if err != nil {
			rpc.Fail(w, http.StatusServiceUnavailable, coordv1.CodeNotLeader, "this coordinator cannot read the catalog: "+err.Error())
			return
		}
		rpc.WriteJSON(w, http.StatusOK, list)
		return
	}
	msg := "this coordinator stands by and no coordinator leads now: try again shortly"
	if leader, err := l.leaderAddr(ctx); err == nil {
		msg = "this coordinator stands by; the leader is at " + leader
	}
	rpc.Fail(w, http.StatusServiceUnavailable, coordv1.CodeNotLeader, msg)
}

// drainWait bounds how long a term that has ended keeps its catalog and
// agent clients open for the requests still in flight (event streams
// last as long as their followers).
const drainWait = time.Minute

// catalogWait bounds a standby's reads of the catalog.
const catalogWait = 2 * time.Second

// leaderAddr is the API address of the leader.
func (l *leadership) leaderAddr(ctx context.Context) (string, error) {
	list, err := Coordinators(ctx, l.cat)
	if err != nil {
		return "", err
	}
	for _, c := range list {
		if c.Leader {
			return c.Addr, nil
		}
	}
	return "", catalog.ErrNotFound
}

// Coordinators lists the coordinators that run, by name, the leader
// marked.
func Coordinators(ctx context.Context, cat *catalog.Catalog) ([]coordv1.Coordinator, error) {
	var out []coordv1.Coordinator
	if _, err := cat.List(ctx, coordinatorsPrefix, func(key string, raw []byte) error {
		var c coordv1.Coordinator
		if err := json.Unmarshal(raw, &c); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		out = append(out, c)
		return nil
	}); err != nil {
		return nil, err
	}
	leader, err := cat.Leader(ctx)
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return nil, err
	}
	for i := range out {
		// Only the election says who leads: a record that says so may be
		// one the leader wrote before it stopped.
		out[i].Leader = out[i].Name == leader && out[i].Term != ""
		if !out[i].Leader {
			out[i].Term, out[i].Since = "", time.Time{}
		}
	}
	slices.SortFunc(out, func(a, b coordv1.Coordinator) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
