package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	agentv1 "cairn/api/agent/v1"
	v1 "cairn/api/coord/v1"
	evv1 "cairn/api/events/v1"
	"cairn/internal/catalog"
	"cairn/internal/events"
	"cairn/internal/names"
	"cairn/internal/pki"
	"cairn/internal/rpc"
)

// Options tunes a Coordinator.
type Options struct {
	// Deadline is how long the prepare phase of a round may take.
	Deadline time.Duration
	// Hold is how long an agent keeps a prepared rank frozen waiting for
	// the decision; it must exceed Deadline.
	Hold time.Duration
	// NodeTTL is how long a node may stay silent before it is dead.
	NodeTTL time.Duration
	// JobSubnets is where job subnets (/24 each) are taken from.
	JobSubnets netip.Prefix
	// EtcdDesc describes the catalog's etcd for health replies.
	EtcdDesc string
	// Events receives the cluster's events; nil keeps them in memory.
	Events *events.Exchange
	// WriteTimeout is how long a caller may leave what the coordinator
	// sends it unread: a connection, or a stream of events, that takes
	// nothing for that long is cut off.
	WriteTimeout time.Duration
}

// Defaults for Options.
const (
	DefaultDeadline = 20 * time.Second
	DefaultNodeTTL  = 4 * time.Second
	// DefaultWriteTimeout is Options.WriteTimeout's default.
	DefaultWriteTimeout = 30 * time.Second
)

// DefaultJobSubnets is the default range of job subnets.
var DefaultJobSubnets = netip.MustParsePrefix("10.224.0.0/12")

// Coordinator serves the coordinator API on top of a catalog.
type Coordinator struct {
	cat   *catalog.Catalog
	creds *pki.Credentials
	log   *slog.Logger
	opts  Options

	mu      sync.Mutex
	clients map[string]*rpc.AgentClient // by node name
	members map[string]*catalog.Membership
	jobMu   map[string]*jobMutex
	lastRun map[string]time.Time // start of each job's last round
	health  map[string][]string  // failing health probes by node, as last heard
	// quarantined: damaged packs in each node's store, as last heard
	quarantined map[string][]string

	wg     sync.WaitGroup
	runCtx context.Context // Run's; background work ends with it
}

// New returns a coordinator over cat, calling agents with creds.
func New(cat *catalog.Catalog, creds *pki.Credentials, log *slog.Logger, opts Options) *Coordinator {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Deadline <= 0 {
		opts.Deadline = DefaultDeadline
	}
	if opts.Hold <= opts.Deadline {
		opts.Hold = opts.Deadline + 10*time.Second
	}
	if opts.NodeTTL <= 0 {
		opts.NodeTTL = DefaultNodeTTL
	}
	if !opts.JobSubnets.IsValid() {
		opts.JobSubnets = DefaultJobSubnets
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.Events == nil {
		opts.Events, _ = events.New(events.Options{Logger: log})
	}
	return &Coordinator{
		cat: cat, creds: creds, log: log, opts: opts,
		clients: map[string]*rpc.AgentClient{},
		members: map[string]*catalog.Membership{}, jobMu: map[string]*jobMutex{},
		lastRun: map[string]time.Time{},
	}
}

// Run serves the API on ln and runs the background work (recovery of
// unfinished job starts, rounds, migrations and restarts, periodic
// checkpoints) until ctx is done.
func (c *Coordinator) Run(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.runCtx = ctx
	c.wg.Add(6)
	go func() { defer c.wg.Done(); c.recoverStarts(ctx) }()
	go func() { defer c.wg.Done(); c.recoverRounds(ctx) }()
	go func() { defer c.wg.Done(); c.recoverMigrations(ctx) }()
	go func() { defer c.wg.Done(); c.recoverRestarts(ctx) }()
	go func() { defer c.wg.Done(); c.periodic(ctx) }()
	go func() { defer c.wg.Done(); c.watchNodes(ctx) }()
	err := rpc.Serve(ctx, ln, c, c.creds, c.log)
	cancel()
	c.wg.Wait()
	c.mu.Lock()
	for _, cl := range c.clients {
		cl.Close()
	}
	c.mu.Unlock()
	return err
}

// lockJob takes the lock that serializes the work on a job (rounds,
// restarts, migrations, kill and rm) and returns its unlock. An entry lives
// only while its lock is held or awaited, so that names asked for in vain
// leave nothing behind.
func (c *Coordinator) lockJob(job string) (unlock func()) {
	unlock, _ = c.jobLock(job, false)
	return unlock
}

// tryLockJob is lockJob that gives up at once if the job is busy.
func (c *Coordinator) tryLockJob(job string) (unlock func(), ok bool) {
	return c.jobLock(job, true)
}

func (c *Coordinator) jobLock(job string, try bool) (func(), bool) {
	c.mu.Lock()
	l := c.jobMu[job]
	if l == nil {
		l = &jobMutex{}
		c.jobMu[job] = l
	}
	l.refs++
	c.mu.Unlock()
	release := func() {
		c.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(c.jobMu, job)
		}
		c.mu.Unlock()
	}
	if try {
		if !l.TryLock() {
			release()
			return nil, false
		}
	} else {
		l.Lock()
	}
	return func() { l.Unlock(); release() }, true
}

// jobMutex is a job's lock and how many hold or await it.
type jobMutex struct {
	sync.Mutex
	refs int
}

// client returns a client for the named node's agent.
func (c *Coordinator) client(ctx context.Context, node string) (*rpc.AgentClient, error) {
	// Cached: every RPC of a round goes through here, and a node's address
	// changes only when it joins again (which drops the cached client).
	c.mu.Lock()
	cl := c.clients[node]
	c.mu.Unlock()
	if cl != nil {
		return cl, nil
	}
	var n v1.Node
	if _, err := c.cat.Get(ctx, nodeKey(node), &n); err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.clients[node]; cl != nil {
		return cl, nil
	}
	cl = rpc.NewAgentClient(n.Addr, node, c.creds)
	c.clients[node] = cl
	return cl, nil
}

// forgetClient drops a node's cached client: the node joined again,
// maybe at another address.
func (c *Coordinator) forgetClient(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.clients[node]; cl != nil {
		cl.Close()
		delete(c.clients, node)
	}
}

// publish puts an event on the cluster's stream.
func (c *Coordinator) publish(e evv1.Event) { c.opts.Events.Publish(e) }

// Events is the coordinator's event stream.
func (c *Coordinator) Events() *events.Exchange { return c.opts.Events }

func nodeKey(name string) string         { return "nodes/" + name }
func jobKey(name string) string          { return "jobs/" + name }
func ckptPrefix(job string) string       { return "ckpts/" + job + "/" }
func ckptKey(job string, seq int) string { return fmt.Sprintf("ckpts/%s/%08d", job, seq) }

// ServeHTTP authenticates the caller and routes the request.
func (c *Coordinator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, ok := rpc.Caller(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	p := r.URL.Path
	switch {
	case p == v1.PathHealth && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, v1.Health{Cluster: c.creds.ClusterID, Version: "v1", Etcd: c.opts.EtcdDesc})
		return
	case p == v1.PathJoin || p == v1.PathHeartbeat:
		if id.Role != pki.Agent {
			fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("only agents join; %s %s is not one", id.Role, id.Name))
			return
		}
		c.serveNode(w, r, id.Name)
		return
	}
	if id.Role != pki.Client && id.Role != pki.Coordinator {
		fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("%s %s may not call %s", id.Role, id.Name, p))
		return
	}
	switch {
	case p == v1.PathEvents && r.Method == http.MethodGet:
		c.serveEvents(w, r)
	case p == v1.PathNodes && r.Method == http.MethodGet:
		nodes, err := c.Nodes(ctx)
		reply(w, http.StatusOK, nodes, err)
	case strings.HasPrefix(p, v1.PathNode) && strings.HasSuffix(p, v1.SuffixSpare) && r.Method == http.MethodPost:
		var req v1.Spare
		node := strings.TrimSuffix(strings.TrimPrefix(p, v1.PathNode), v1.SuffixSpare)
		if err := names.Node(node); err != nil {
			failErr(w, err)
			return
		}
		if !decode(w, r, &req) {
			return
		}
		n, err := c.SetSpare(ctx, node, req.Spare)
		reply(w, http.StatusOK, n, err)
	case strings.HasPrefix(p, v1.PathNode) && strings.HasSuffix(p, v1.SuffixDrain) && r.Method == http.MethodPost:
		var req v1.Drain
		node := strings.TrimSuffix(strings.TrimPrefix(p, v1.PathNode), v1.SuffixDrain)
		if err := names.Node(node); err != nil {
			failErr(w, err)
			return
		}
		if !decode(w, r, &req) {
			return
		}
		out, err := c.Drain(context.WithoutCancel(ctx), node, req.Undrain)
		reply(w, http.StatusOK, out, err)
	case p == v1.PathJobs && r.Method == http.MethodGet:
		jobs, err := c.Jobs(ctx)
		reply(w, http.StatusOK, jobs, err)
	case p == v1.PathJobs && r.Method == http.MethodPost:
		var req v1.RunJob
		if !decode(w, r, &req) {
			return
		}
		j, err := c.RunJob(ctx, req)
		reply(w, http.StatusCreated, j, err)
	case strings.HasPrefix(p, v1.PathJob):
		rest := strings.TrimPrefix(p, v1.PathJob)
		name, suffix, _ := strings.Cut(rest, "/")
		if suffix != "" {
			suffix = "/" + suffix
		}
		if err := validJobName(name); err != nil {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
			return
		}
		switch {
		case suffix == "" && r.Method == http.MethodGet:
			st, err := c.Status(ctx, name)
			reply(w, http.StatusOK, st, err)
		case suffix == "" && r.Method == http.MethodDelete:
			out, err := c.RemoveJob(ctx, name, r.URL.Query().Get("force") == "1")
			reply(w, http.StatusOK, out, err)
		case suffix == v1.SuffixKill && r.Method == http.MethodPost:
			var req v1.Kill
			if r.ContentLength != 0 && !decode(w, r, &req) {
				return
			}
			if req.Signal < 0 || req.Signal > 64 {
				fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, fmt.Sprintf("signal %d: not a signal", req.Signal))
				return
			}
			j, err := c.KillJob(ctx, name, syscall.Signal(req.Signal))
			reply(w, http.StatusOK, j, err)
		case suffix == v1.SuffixCheckpoint && r.Method == http.MethodPost:
			// The round belongs to the cluster, not to this request: a CLI
			// that goes away does not cancel it.
			ck, err := c.Checkpoint(context.WithoutCancel(ctx), name, false)
			reply(w, http.StatusOK, ck, err)
		case suffix == v1.SuffixMigrate && r.Method == http.MethodPost:
			var req v1.Migrate
			if !decode(w, r, &req) {
				return
			}
			m, err := c.Migrate(context.WithoutCancel(ctx), name, req.Rank, req.To)
			if err != nil && m != nil && m.State == v1.MigrationDone {
				err = nil // it moved; the errors are in m.Reason
			}
			reply(w, http.StatusOK, m, err)
		case suffix == v1.SuffixMigrations && r.Method == http.MethodGet:
			ms, err := c.Migrations(ctx, name)
			reply(w, http.StatusOK, ms, err)
		case suffix == v1.SuffixCheckpoints && r.Method == http.MethodGet:
			cks, err := c.Checkpoints(ctx, name)
			reply(w, http.StatusOK, cks, err)
		case suffix == v1.SuffixRestart && r.Method == http.MethodPost:
			var req v1.Restart
			if !decode(w, r, &req) {
				return
			}
			j, err := c.Restart(context.WithoutCancel(ctx), name, req)
			reply(w, http.StatusOK, j, err)
		default:
			fail(w, http.StatusNotFound, agentv1.CodeNotFound, r.Method+" "+p+" is not in the coordinator API")
		}
	default:
		fail(w, http.StatusNotFound, agentv1.CodeNotFound, r.Method+" "+p+" is not in the coordinator API")
	}
}

// serveNode handles an agent's join or heartbeat. An agent may only speak
// for the node its certificate names.
func (c *Coordinator) serveNode(w http.ResponseWriter, r *http.Request, certName string) {
	ctx := r.Context()
	if r.URL.Path == v1.PathHeartbeat {
		var hb v1.Heartbeat
		if !decode(w, r, &hb) {
			return
		}
		if hb.Name != certName {
			fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("agent %s may not speak for node %s", certName, hb.Name))
			return
		}
		err := c.heartbeat(ctx, certName)
		if err == nil {
			c.noteHealth(ctx, certName, hb.Health)
			c.noteQuarantine(ctx, certName, hb.Quarantined)
		}
		reply(w, http.StatusNoContent, nil, err)
		return
	}
	var j v1.Join
	if !decode(w, r, &j) {
		return
	}
	if j.Name != certName {
		fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("agent %s may not join as node %s", certName, j.Name))
		return
	}
	if _, err := netip.ParseAddr(j.Underlay); err != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "underlay: "+err.Error())
		return
	}
	if _, _, err := net.SplitHostPort(j.Addr); err != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "addr: "+err.Error())
		return
	}
	n := v1.Node{Name: j.Name, Addr: j.Addr, Underlay: j.Underlay, Labels: j.Labels, Joined: time.Now().UTC()}
	var old v1.Node
	if _, err := c.cat.Get(ctx, nodeKey(j.Name), &old); err == nil {
		n.Spare, n.Drained = old.Spare, old.Drained // a node that comes back stays what it was
	}
	if err := c.cat.Put(ctx, nodeKey(j.Name), &n); err != nil {
		failErr(w, err)
		return
	}
	c.forgetClient(j.Name)
	if err := c.register(ctx, j.Name); err != nil {
		failErr(w, err)
		return
	}
	c.log.Info("node joined", "node", j.Name, "addr", j.Addr)
	c.publish(evv1.Event{Type: evv1.NodeJoined, Node: j.Name, Message: j.Addr})
	writeJSON(w, http.StatusOK, v1.JoinReply{Heartbeat: c.opts.NodeTTL / 4, TTL: c.opts.NodeTTL})
}

func (c *Coordinator) register(ctx context.Context, name string) error {
	m, err := c.cat.Register(ctx, name, c.opts.NodeTTL)
	if err != nil {
		return err
	}
	c.mu.Lock()
	old := c.members[name]
	c.members[name] = m
	c.mu.Unlock()
	_ = old // its lease expires by itself; the key now belongs to m
	return nil
}

// heartbeat refreshes a node's lease. A node the catalog does not know
// must join again; a known node whose lease this coordinator does not
// hold (it restarted) gets a new one.
func (c *Coordinator) heartbeat(ctx context.Context, name string) error {
	var n v1.Node
	if _, err := c.cat.Get(ctx, nodeKey(name), &n); err != nil {
		return err
	}
	c.mu.Lock()
	m := c.members[name]
	c.mu.Unlock()
	if m != nil {
		err := m.KeepAlive(ctx)
		if err == nil {
			return nil
		}
		if !errors.Is(err, catalog.ErrLeaseExpired) {
			return err
		}
		c.log.Warn("node came back after its lease expired", "node", name)
	}
	return c.register(ctx, name)
}

// Nodes lists the nodes with their liveness and load.
func (c *Coordinator) Nodes(ctx context.Context) ([]v1.Node, error) {
	alive, err := c.cat.Alive(ctx)
	if err != nil {
		return nil, err
	}
	load, err := c.load(ctx)
	if err != nil {
		return nil, err
	}
	var out []v1.Node
	_, err = c.cat.List(ctx, "nodes/", func(_ string, raw []byte) error {
		var n v1.Node
		if err := json.Unmarshal(raw, &n); err != nil {
			return err
		}
		n.Alive, n.Ranks = alive[n.Name], load[n.Name]
		out = append(out, n)
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

// load counts the ranks placed on each node by jobs that are not killed.
func (c *Coordinator) load(ctx context.Context) (map[string]int, error) {
	jobs, err := c.Jobs(ctx)
	if err != nil {
		return nil, err
	}
	load := map[string]int{}
	for _, j := range jobs {
		if j.State == v1.JobKilled || j.State == v1.JobFailed || j.State == v1.JobExited {
			continue
		}
		for _, n := range j.Placement {
			load[n]++
		}
	}
	return load, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) { rpc.WriteJSON(w, status, v) }

func fail(w http.ResponseWriter, status int, code, msg string) { rpc.Fail(w, status, code, msg) }

func decode(w http.ResponseWriter, r *http.Request, v any) bool { return rpc.Decode(w, r, v) }

func reply(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		failErr(w, err)
		return
	}
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	writeJSON(w, status, v)
}

// failErr maps an error to the wire.
func failErr(w http.ResponseWriter, err error) {
	var we *v1.Error
	switch {
	case errors.As(err, &we):
		// Keep the code, but say where it came from.
		rpc.FailError(w, &v1.Error{Code: we.Code, Message: err.Error()})
	case errors.Is(err, names.ErrInvalid):
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
	case errors.Is(err, catalog.ErrNotFound):
		fail(w, http.StatusNotFound, agentv1.CodeNotFound, err.Error())
	case errors.Is(err, catalog.ErrExists):
		fail(w, http.StatusConflict, agentv1.CodeExists, err.Error())
	default:
		fail(w, http.StatusInternalServerError, agentv1.CodeInternal, err.Error())
	}
}

func apiErr(code, format string, args ...any) error {
	return &v1.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
