// The agent's lifecycle: what `cairn agent` runs, from its credentials to
// serving.

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/cpufeat"
	"github.com/cairn-hpc/cairn/internal/launch"
	"github.com/cairn-hpc/cairn/internal/metrics"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/service"
	"github.com/cairn-hpc/cairn/internal/version"
)

// Config is everything an agent runs with.
type Config struct {
	// Creds is the directory of the node's credentials (role agent); no
	// rank ever sees it.
	Creds string
	// CPU lists the CPU features the node declares at its join; nil reads
	// them from /proc/cpuinfo (cpufeat).
	CPU []string
	// RenewBefore: in a cluster, the agent asks the coordinator to renew
	// its certificate once it expires within this (0: never).
	RenewBefore time.Duration
	// Container are the options of the node's Manager.
	Container container.Options
	// Listen is the address the agent API is served on.
	Listen string
	// Coordinator, when set, is the address of the coordinator the agent
	// joins as the node its certificate names (or the addresses of
	// several, separated by commas: the leader among them answers), and
	// keeps its membership alive with heartbeats. Underlay is then required: the address other
	// nodes reach this one at, over which job networks run.
	Coordinator string
	Underlay    netip.Addr
	// UnderlayDev is the device job networks' VXLAN goes out of; ""
	// means the one that holds Underlay.
	UnderlayDev string
	// Advertise is the agent API address the coordinator calls (default:
	// the listener's).
	Advertise string
	// Labels are the node's labels (rack=r1).
	Labels map[string]string
	// NetnsPrefix starts the names of rank network namespaces (default
	// cairn-NODE-).
	NetnsPrefix string
	// Health are the health probes run while joined; Node and DataDir are
	// the agent's.
	Health HealthConfig
	// HealthListen, if set, is where GET /healthz answers, plain HTTP and
	// unauthenticated (package service).
	HealthListen string
	// MetricsTokenFile holds a bearer token that lets a scraper without a
	// client certificate read /metrics ("": none).
	MetricsTokenFile string
	// SelfFence freezes the node's ranks while no coordinator answers
	// (selffence.go). Without it they run on, and a node cut off may run
	// a rank that a restart brought back elsewhere until it is heard
	// again.
	SelfFence bool
	// ToolsDir keeps the tools mounted in MPI ranks, by content: Exe
	// (default: this executable) and the MPICH fix library MPICHFix.
	ToolsDir, Exe, MPICHFix string
	// Logger: nil logs nothing.
	Logger *slog.Logger
}

// Agent is a node's agent, ready to serve.
type Agent struct {
	cfg   Config
	creds *pki.Credentials
	token metrics.Token
	m     *container.Manager
	tools string
	ln    net.Listener
	log   *slog.Logger
}

// New loads the node's credentials, opens its Manager, installs the tools
// of MPI ranks and listens on cfg.Listen.
func New(cfg Config) (*Agent, error) {
	service.Take() // before any runc: it would pass the socket into containers
	if cfg.Creds == "" {
		return nil, errors.New("agent: no credentials directory")
	}
	if cfg.Coordinator != "" && !cfg.Underlay.IsValid() {
		return nil, errors.New("agent: joining a coordinator needs the node's underlay address")
	}
	if cfg.Coordinator != "" && cfg.UnderlayDev == "" {
		dev, err := netw.DeviceOf(cfg.Underlay)
		if err != nil {
			return nil, fmt.Errorf("agent: underlay %s: %w; give this node's own address on the network between nodes", cfg.Underlay, err)
		}
		cfg.UnderlayDev = dev
	}
	c, err := pki.LoadCredentials(cfg.Creds)
	if err != nil {
		return nil, err
	}
	if c.Role != pki.Agent {
		return nil, fmt.Errorf("credentials in %s are for a %s, not an agent", cfg.Creds, c.Role)
	}
	token, err := metrics.LoadToken(cfg.MetricsTokenFile)
	if err != nil {
		return nil, err
	}
	if cfg.NetnsPrefix == "" {
		cfg.NetnsPrefix = "cairn-" + c.Name + "-"
	}
	a := &Agent{cfg: cfg, creds: c, token: token, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	// The node's credentials are never a rank's to read.
	opts := cfg.Container
	opts.Hide = append(opts.Hide[:len(opts.Hide):len(opts.Hide)], cfg.Creds)
	if a.m, err = container.New(opts); err != nil {
		return nil, err
	}
	exe := cfg.Exe
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if a.tools, err = launch.InstallTools(cfg.ToolsDir, exe, cfg.MPICHFix); err != nil {
		return nil, fmt.Errorf("install the tools of MPI ranks in %s: %w", cfg.ToolsDir, err)
	}
	if a.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, err
	}
	return a, nil
}

// Addr is the address the agent serves on.
func (a *Agent) Addr() net.Addr { return a.ln.Addr() }

// Run serves the agent API until ctx is done, joined to the coordinator
// if there is one. First it unlocks the network of every rank an earlier
// agent left locked.
func (a *Agent) Run(ctx context.Context) error {
	c := a.creds
	unlockRanks(ctx, a.m, a.log)
	if err := container.BoundingCaps(); err != nil {
		a.log.Warn("checkpoints are limited on this node", "limit", err)
	}
	a.log.Info("agent serving", "node", c.Name, "addr", a.ln.Addr().String(), "cluster", c.ClusterID)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	node := Node{NetnsPrefix: a.cfg.NetnsPrefix, HostPorts: a.cfg.Container.Bridge.HostPorts}
	s := &Server{Manager: a.m, Creds: c, Logger: a.log, Node: node, Tools: a.tools, MetricsToken: a.token}
	var h *Health // the health probes run only in a cluster
	if a.cfg.Coordinator != "" {
		hc := a.cfg.Health
		hc.Node, hc.DataDir = a.creds.Name, a.cfg.Container.DataDir
		h = NewHealth(hc)
	}
	s.Metrics = newMetrics(c, a.m, h)
	service.KeepCredentials(ctx, c, service.ReloadEvery, a.log)
	if a.cfg.Coordinator != "" {
		s.Node.Underlay, s.Node.Dev = a.cfg.Underlay, a.cfg.UnderlayDev
		a.join(ctx, h, s)
		// The ranks' requests go to the coordinator as this node's.
		co := rpc.NewCoordClient(a.cfg.Coordinator, a.creds)
		defer co.Close()
		s.Coord = co
		if a.cfg.RenewBefore > 0 {
			go service.KeepRenewed(ctx, a.creds, a.cfg.RenewBefore, renewEvery, "the coordinator",
				func(ctx context.Context) error { return renew(ctx, a.creds, co) }, a.log)
		}
	}
	if a.cfg.HealthListen != "" {
		if _, err := service.ServeHealth(ctx, a.cfg.HealthListen, a.log); err != nil {
			return err
		}
	}
	status := fmt.Sprintf("node %s serving on %s", c.Name, a.ln.Addr())
	if a.cfg.Coordinator != "" {
		status += ", member of the cluster of " + a.cfg.Coordinator
	}
	service.Ready(status, a.log)
	defer service.Stopping(a.log)
	return s.Serve(ctx, a.ln)
}

// join starts the health probes h and the membership of the cluster, and
// the node's self-fence, until ctx is done; s is told the leading
// coordinator's term.
func (a *Agent) join(ctx context.Context, h *Health, s *Server) {
	advertise := a.cfg.Advertise
	if advertise == "" {
		advertise = a.ln.Addr().String()
	}
	cpu := a.cfg.CPU
	if cpu == nil {
		var err error
		if cpu, err = cpufeat.Read(); err != nil {
			a.log.Warn("CPU features not read: jobs are placed here whatever they need", "err", err)
		}
	}
	j := coordv1.Join{Name: a.creds.Name, Addr: advertise, Underlay: a.cfg.Underlay.String(), Labels: a.cfg.Labels,
		API: coordv1.APIVersion, Version: version.Get().Version, CPU: cpu}
	go h.Run(ctx, func(w []string) {
		if len(w) > 0 {
			a.log.Warn("health probes failing", "probes", strings.Join(w, "; "))
		} else {
			a.log.Info("health probes pass")
		}
	})
	m := &membership{a: a, h: h, s: s, fence: newSelfFence(s, a.log)}
	if a.cfg.SelfFence {
		go m.fence.watch(ctx)
	}
	go keepJoined(ctx, rpc.NewCoordClient(a.cfg.Coordinator, a.creds), j, m, a.log)
}

// membership is the agent's side of its membership of the cluster (member).
type membership struct {
	a     *Agent
	h     *Health
	s     *Server
	fence *selfFence
}

func (n *membership) beat() coordv1.Heartbeat {
	return coordv1.Heartbeat{Name: n.a.creds.Name, Health: n.h.Warnings(), Quarantined: n.a.quarantined(), Ended: n.a.endedRanks(),
		Fenced: n.fence.list(), Live: rankNamesOf(n.a.m.Unended())}
}

func (n *membership) joined(r coordv1.JoinReply) {
	n.s.sawTerm(r.Term)
	n.fence.joined(r.TTL)
}

func (n *membership) answered(ctx context.Context, r coordv1.HeartbeatReply) {
	n.s.sawTerm(r.Term)
	n.fence.answered()
	var strays []string
	for _, name := range r.Drop {
		if !n.fence.holds(name) {
			strays = append(strays, name)
		}
	}
	n.fence.settle(ctx, r.Release, r.Drop)
	for _, name := range strays {
		job, rank, ok := agentv1.ParseRankName(name)
		if !ok {
			continue
		}
		if err := n.s.rankRemove(ctx, agentv1.RankRemove{Rank: agentv1.Rank{Job: job, Rank: rank}, Keep: true}); err != nil {
			n.a.log.Error("stop a rank no job places here", "rank", name, "err", err)
			continue
		}
		n.a.log.Warn("stopped a rank no job places on this node (its output kept)", "rank", name)
	}
}

// rankNamesOf keeps the rank containers' names of names.
func rankNamesOf(names []string) []string {
	var out []string
	for _, name := range names {
		if _, _, ok := agentv1.ParseRankName(name); ok {
			out = append(out, name)
		}
	}
	return out
}

// endedRanks lists the node's rank containers whose processes have ended,
// reported with every heartbeat: the coordinator then looks at how their
// jobs stand (ended, failed).
func (a *Agent) endedRanks() []string {
	var out []string
	for _, name := range a.m.Ended() {
		if _, _, ok := agentv1.ParseRankName(name); ok {
			out = append(out, name)
		}
	}
	return out
}

// quarantined lists the damaged packs of the store's quarantine, reported
// with every heartbeat: the coordinator publishes each new one.
func (a *Agent) quarantined() []string {
	qs, err := a.m.Repo().Quarantined()
	if err != nil {
		return []string{"cannot read the store's quarantine: " + err.Error()}
	}
	var out []string
	for _, q := range qs {
		out = append(out, q.String())
	}
	return out
}

// unlockRanks releases what an agent that died in the middle of a round
// may have left: ranks frozen (Manager.Recover) and rank networks locked.
// A new agent holds no round.
func unlockRanks(ctx context.Context, m *container.Manager, log *slog.Logger) {
	if err := m.Recover(ctx); err != nil {
		log.Warn("release containers an interrupted checkpoint left frozen", "err", err)
	}
	list, err := m.List(ctx)
	if err != nil {
		log.Warn("list containers", "err", err)
		return
	}
	for _, in := range list {
		if in.Config.Net == nil {
			continue
		}
		if locked, err := netw.NetnsLocked(ctx, in.Config.Net.Netns); err == nil && locked {
			log.Warn("unlocking the network of a rank an earlier agent left locked", "container", in.Name)
			if err := netw.UnlockNetns(ctx, in.Config.Net.Netns); err != nil {
				log.Warn("unlock", "container", in.Name, "err", err)
			}
		}
	}
}
