package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/events"
	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/metrics"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"

	"golang.org/x/time/rate"
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
	// CA, if set, renews agents' certificates when they ask
	// (coordv1.PathRenew).
	CA *pki.CA
	// Events receives the cluster's events; nil keeps them in memory.
	Events *events.Exchange
	// WriteTimeout is how long a caller may leave what the coordinator
	// sends it unread: a connection, or a stream of events, that takes
	// nothing for that long is cut off.
	WriteTimeout time.Duration
	// Dial makes the client of a node's agent; nil dials it over the
	// wire (api/agent/v1) with the coordinator's credentials.
	Dial Dialer
	// MTBF is the mean time between failures of a node, for jobs with an
	// automatic checkpoint interval that give none, until the cluster
	// has seen enough node failures to estimate it (docs/planning.md).
	MTBF time.Duration
	// Metrics, if set, are fed the coordinator's events and records and
	// served at GET /metrics to clients and the coordinator, and to a
	// caller without a certificate that has MetricsToken.
	Metrics      *metrics.Coord
	MetricsToken metrics.Token
	// Trace, if set, is told every phase a protocol records and every
	// failpoint it passes, as it happens, with the job's name: the steps
	// that order a protocol's calls to agents (tests print traces with
	// it).
	Trace func(job, step string)
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

	agents *agents      // the clients of the nodes' agents
	locks  jobLocks     // serialize the work on each job
	sup    *supervisor  // decides what the coordinator does on its own
	rec    *records     // the catalog's records, read and written
	nodes  *nodeReports // what the nodes' joins and heartbeats tell
	// The protocols' drivers.
	rounds *rounds
	runs   *jobRuns // job start, restart
	migs   *migrations
	repl   *replicator
	// The rest of the coordinator's work.
	intervals *intervals
	fence     *fence
	life      *lifecycle
	ranks     *rankAPI
	feed      *metricsFeed
	tally     *failureTally
	keep      *retention // retention of jobs' checkpoints (retain.go)
	tiers     *tiers     // the durable tier, through the agents (tier.go)

	wg     sync.WaitGroup
	runCtx context.Context // Start's; background work ends with it
	// replaced, once a newer coordinator has taken a term, holds it: this
	// one then stops its own work (watchTerm).
	replaced atomic.Pointer[agentv1.Term]
	depose   context.CancelFunc // ends Start's work

	httpOnce sync.Once
	http     http.Handler // the API, made at the first request
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
	if opts.Dial == nil {
		opts.Dial = rpcDialer(creds)
	}
	c := &Coordinator{
		cat: cat, creds: creds, log: log, opts: opts,
		agents: &agents{cat: cat, dial: opts.Dial, clients: map[string]Agent{}},
		locks:  jobLocks{held: map[string]*jobMutex{}},
	}
	c.sup = newSupervisor(c)
	c.rec, c.nodes, c.repl, c.rounds, c.migs, c.runs = &records{c: c}, &nodeReports{c: c, members: map[string]*catalog.Membership{}}, &replicator{c: c}, &rounds{c: c}, &migrations{c: c}, &jobRuns{c: c}
	c.intervals, c.fence, c.life, c.ranks, c.feed, c.tally = &intervals{c: c}, &fence{c: c}, &lifecycle{c: c}, &rankAPI{c: c, events: map[string]*rate.Limiter{}, rounds: map[string]*rankRound{}}, &metricsFeed{c: c}, &failureTally{c: c}
	c.keep, c.tiers = &retention{c: c}, &tiers{c: c}
	if opts.Metrics != nil {
		opts.Metrics.SetCatalog(c)
	}
	return c
}

// Run serves the API on ln and does the coordinator's own work (Start)
// until ctx is done.
func (c *Coordinator) Run(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wait := c.Start(ctx)
	conf := pki.ServerConfig(c.creds)
	if len(c.opts.MetricsToken) > 0 {
		conf = pki.ServerConfigOptionalCert(c.creds) // handler refuses all but a scrape with the token
	}
	err := rpc.ServeTLS(ctx, ln, c, conf, c.log)
	cancel()
	wait()
	return err
}

// Start begins the coordinator's own work, until ctx is done: it
// finishes what an earlier coordinator left unfinished (job starts,
// rounds, migrations, restarts), takes periodic checkpoints and watches
// the nodes. wait returns once all of it has ended, and closes the
// agents' clients.
func (c *Coordinator) Start(ctx context.Context) (wait func()) {
	ctx, c.depose = context.WithCancel(ctx)
	c.runCtx = ctx
	c.fence.takeTerm(ctx)
	works := []func(context.Context){
		c.runs.recoverStarts, c.rounds.recoverRounds, c.migs.recoverMigrations, c.runs.recoverRestarts, c.sup.run, c.sup.watchNodes, c.tally.watchFailures,
		c.fence.watchTerm,
	}
	if c.opts.Metrics != nil {
		// What was published before this coordinator started is history.
		past := c.opts.Events.History(events.Filter{})
		works = append(works, func(ctx context.Context) { c.feed.feedMetrics(ctx, past) })
	}
	for _, work := range works {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); work(ctx) }()
	}
	return func() {
		c.wg.Wait()
		c.agents.closeAll()
	}
}

// background runs fn on its own, with the coordinator's context if it
// has started (fn outlives the request that caused it), and Start's wait
// waits for it.
func (c *Coordinator) background(fn func(ctx context.Context)) {
	ctx := context.Background()
	if c.runCtx != nil {
		ctx = c.runCtx
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		fn(ctx)
	}()
}

// hold holds at the failpoint name if it is set (failpoint.Hold).
func (c *Coordinator) hold(ctx context.Context, name string) { failpoint.Hold(ctx, name, c.log) }

// trace tells Options.Trace of a step of a protocol on job.
func (c *Coordinator) trace(job, step string) {
	if c.opts.Trace != nil {
		c.opts.Trace(job, step)
	}
}

// publish puts an event on the cluster's stream.
func (c *Coordinator) publish(e evv1.Event) { c.opts.Events.Publish(e) }

// Events is the coordinator's event stream.
func (c *Coordinator) Events() *events.Exchange { return c.opts.Events }

// Nodes lists the nodes with their liveness and load.
func (c *Coordinator) Nodes(ctx context.Context) ([]coordv1.Node, error) {
	alive, err := c.cat.Alive(ctx)
	if err != nil {
		return nil, err
	}
	load, err := c.rec.load(ctx)
	if err != nil {
		return nil, err
	}
	var out []coordv1.Node
	_, err = c.cat.List(ctx, "nodes/", func(_ string, raw []byte) error {
		var n coordv1.Node
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

func apiErr(code, format string, args ...any) error {
	return &coordv1.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
