package testbed

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/durable"
	"github.com/cairn-hpc/cairn/internal/metrics"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// The testbed's service ports.
const (
	CoordPort = 7400 // the first coordinator's; the next one's is one more
	PeerPort  = 7410 // the first coordinator's etcd's, with several
	AgentPort = 7420
)

// ErrBadConfig marks a Config no testbed can be made of.
var ErrBadConfig = errors.New("bad testbed config")

type configError struct{ error }

func (e configError) Unwrap() error        { return e.error }
func (e configError) Is(target error) bool { return target == ErrBadConfig }

// Config says what testbed Up makes.
type Config struct {
	Dir      string       // the testbed's directory (Dir of a data dir)
	Nodes    int          // how many
	Prefix   string       // names of its namespaces, bridges and nodes start with it
	Underlay netip.Prefix // the subnet between nodes
	// Staging holds each node's staging dir (Staging/NODE; default
	// container.DefaultStagingDir).
	Staging string
	// CLI is how a user calls cairn for this testbed, in hints (default
	// "cairn"; "cairn --data DIR" for another data dir).
	CLI string
	// Exe is the cairn binary the processes run (default: this
	// executable); CRIU and Runc are the agents' binaries (default: their
	// defaults).
	Exe, CRIU, Runc string
	// Coordinators is how many coordinators run (an odd number; 0: one).
	// With several, each has an embedded etcd member of one cluster.
	Coordinators int
	// The coordinator's options, as `cairn coordinator` takes them (zero:
	// its defaults).
	JobSubnets        string
	Deadline, NodeTTL time.Duration
	MTBF              time.Duration
	Hooks             []string
	HookSecretFile    string
	HookCA            string
	// UIListen is the loopback address of the coordinator's dashboard
	// (port 0: a free port; "": none). Up makes its token.
	UIListen string
	// MetricsTokenFile is the coordinator's and every agent's
	// --metrics-token-file ("": none).
	MetricsTokenFile string
	// The agents' health probes (as `cairn agent` takes them; 0: the
	// agent's default).
	HealthCmd   string
	HealthEvery time.Duration
	// ClockOffsets moves a node's CLOCK_MONOTONIC and CLOCK_BOOTTIME, as
	// seen by its agent and everything it starts, by whole seconds: as on
	// a machine booted that much earlier (negative: later), which separate
	// hosts are. Keyed by node name, with or without Prefix.
	ClockOffsets map[string]time.Duration
	// Out is told about each process as it starts (nil: nothing).
	Out io.Writer
}

// clockOffsets checks cfg.ClockOffsets against the nodes' names and
// returns each node's offset in seconds.
func (cfg Config) clockOffsets(nodes []netw.Node) (map[string]int64, error) {
	out := map[string]int64{}
	for key, d := range cfg.ClockOffsets {
		if d%time.Second != 0 {
			return nil, fmt.Errorf("clock offset %s of %s: want whole seconds", d, key)
		}
		i := slices.IndexFunc(nodes, func(n netw.Node) bool { return n.Name == key || n.Name == cfg.Prefix+key })
		if i < 0 {
			return nil, fmt.Errorf("clock offset for %s: no such node (%s1..%s%d)", key, cfg.Prefix+"n", cfg.Prefix+"n", len(nodes))
		}
		out[nodes[i].Name] = int64(d / time.Second)
	}
	return out, nil
}

// joinWithin bounds the wait for every node to join.
const joinWithin = 60 * time.Second

func (cfg Config) cli() string {
	if cfg.CLI == "" {
		return "cairn"
	}
	return cfg.CLI
}

// Up makes a testbed and returns once every node has joined. When it
// fails, it removes whatever it made.
func Up(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	dir := cfg.Dir
	if _, err := os.Stat(file(dir)); err == nil {
		return nil, fmt.Errorf("a local cluster exists (%s); remove it with `%s down` first", dir, cfg.cli())
	}
	if cfg.Exe == "" {
		if cfg.Exe, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Staging == "" {
		cfg.Staging = container.DefaultStagingDir
	}
	if _, err := metrics.LoadToken(cfg.MetricsTokenFile); err != nil {
		return nil, configError{err}
	}
	cl, err := netw.NewCluster(cfg.Prefix, cfg.Underlay, cfg.Nodes)
	if err != nil {
		return nil, configError{err}
	}
	cl.HostAddr = true
	offsets, err := cfg.clockOffsets(cl.Nodes)
	if err != nil {
		return nil, configError{err}
	}
	ui := ""
	if cfg.UIListen != "" {
		if ui, err = dashboardURL(cfg.UIListen); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if cfg.Coordinators == 0 {
		cfg.Coordinators = 1
	}
	if cfg.Coordinators < 0 || cfg.Coordinators%2 == 0 || cfg.Coordinators > 9 {
		return nil, configError{fmt.Errorf("%d coordinators: want an odd number up to 9", cfg.Coordinators)}
	}
	c := &Cluster{dir: dir, Prefix: cfg.Prefix, Underlay: cfg.Underlay.String(), Created: time.Now().UTC(), UI: ui}
	var addrs []string
	for i := range cfg.Coordinators {
		co := Coord{Name: fmt.Sprintf("c%d", i+1), Dir: filepath.Join(dir, "coordinator"),
			Addr: netip.AddrPortFrom(cl.Underlay.Gateway(), CoordPort+uint16(i)).String()}
		if i > 0 {
			co.Dir += "-" + co.Name
		}
		if cfg.Coordinators > 1 {
			co.Peer = "https://" + netip.AddrPortFrom(cl.Underlay.Gateway(), PeerPort+uint16(i)).String()
		}
		c.Coordinators = append(c.Coordinators, co)
		addrs = append(addrs, co.Addr)
	}
	c.Coordinator = strings.Join(addrs, ",")
	// From here on, whatever fails takes everything down again.
	if err := c.Save(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = c.Down(context.WithoutCancel(ctx), Runtime{CRIU: cfg.CRIU, Runc: cfg.Runc})
		}
	}()
	ca, err := pki.Init(filepath.Join(dir, "pki"), pki.InitOptions{Force: true})
	if err != nil {
		return nil, err
	}
	issue := func(name string, role pki.Role, to string, ips ...net.IP) error {
		creds, err := ca.Issue(name, role, pki.IssueOptions{IPs: ips})
		if err != nil {
			return err
		}
		return creds.Write(to)
	}
	for _, co := range c.Coordinators {
		if err := issue(rpc.CoordServerName, pki.Coordinator, filepath.Join(co.Dir, "creds"), net.IP(cl.Underlay.Gateway().AsSlice())); err != nil {
			return nil, err
		}
	}
	if err := issue("client", pki.Client, c.ClientCreds()); err != nil {
		return nil, err
	}
	if c.UI != "" {
		if err := durable.WriteFile(c.UITokenFile(), []byte(rand.Text()+rand.Text()+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	if err := cl.Create(ctx); err != nil {
		return nil, err
	}
	// The coordinators, on the host.
	for i := range c.Coordinators {
		co := &c.Coordinators[i]
		if co.PID, err = Spawn(co.Log(), append([]string{cfg.Exe}, cfg.coordinatorArgs(c, *co)...), nil); err != nil {
			return nil, err
		}
		if err := c.Save(); err != nil {
			return nil, err
		}
		fmt.Fprintf(cfg.Out, "coordinator %s at %s (pid %d)\n", co.Name, co.Addr, co.PID)
	}
	if c.UI != "" {
		fmt.Fprintf(cfg.Out, "dashboard at %s (read-only, from this machine): log in once at %slogin with the token in %s\n", c.UI, c.UI, c.UITokenFile())
	}
	// The agents, one in each node's network namespace.
	for _, node := range cl.Nodes {
		nd := c.nodeDir(node.Name)
		n := Node{Name: node.Name, Addr: netip.AddrPortFrom(node.Addr, AgentPort).String(),
			Data: filepath.Join(nd, "data"), Staging: filepath.Join(cfg.Staging, node.Name)}
		if err := issue(node.Name, pki.Agent, filepath.Join(nd, "creds"), net.IP(node.Addr.AsSlice())); err != nil {
			return nil, err
		}
		args, err := cfg.agentArgs(c, n, node.Addr)
		if err != nil {
			return nil, err
		}
		n.Argv = []string{"nsenter", "--net=" + node.Path(), "--"}
		if off, ok := offsets[node.Name]; ok {
			n.ClockOffset = off
			// The agent enters the new time namespace at exec.
			n.Argv = append(n.Argv, "unshare", "--time", fmt.Sprintf("--monotonic=%d", off), fmt.Sprintf("--boottime=%d", off), "--")
		}
		n.Argv = append(append(n.Argv, cfg.Exe), args...)
		if n.PID, err = Spawn(c.AgentLog(n.Name), n.Argv, nil); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		if err := c.Save(); err != nil {
			return nil, err
		}
	}
	if err := c.waitJoined(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// coordinatorArgs are the command line of one of the testbed's
// coordinators.
func (cfg Config) coordinatorArgs(c *Cluster, co Coord) []string {
	args := []string{"--data", co.Dir, "coordinator",
		"--creds", filepath.Join(co.Dir, "creds"), "--dir", co.Dir,
		"--listen", co.Addr, "--name", co.Name}
	if co.Peer != "" {
		var peers []string
		for _, p := range c.Coordinators {
			peers = append(peers, p.Name+"="+p.Peer)
		}
		args = append(args, "--peers", strings.Join(peers, ","))
	}
	if cfg.JobSubnets != "" {
		args = append(args, "--job-subnets", cfg.JobSubnets)
	}
	if cfg.Deadline > 0 {
		args = append(args, "--deadline", cfg.Deadline.String())
	}
	if cfg.NodeTTL > 0 {
		args = append(args, "--node-ttl", cfg.NodeTTL.String())
	}
	if cfg.MTBF > 0 {
		args = append(args, "--mtbf", cfg.MTBF.String())
	}
	for _, h := range cfg.Hooks {
		args = append(args, "--hook", h)
	}
	if c.UI != "" {
		u, _ := url.Parse(c.UI)
		args = append(args, "--ui-listen", u.Host, "--ui-token-file", c.UITokenFile())
	}
	if cfg.HookSecretFile != "" {
		args = append(args, "--hook-secret-file", cfg.HookSecretFile)
	}
	if cfg.HookCA != "" {
		args = append(args, "--hook-ca", cfg.HookCA)
	}
	if cfg.MetricsTokenFile != "" {
		args = append(args, "--metrics-token-file", cfg.MetricsTokenFile)
	}
	return args
}

// agentArgs are the command line of a node's agent.
func (cfg Config) agentArgs(c *Cluster, n Node, underlay netip.Addr) ([]string, error) {
	// Ranks see nothing of the testbed's dir: the CA key, every node's
	// credentials and data, the coordinator's.
	hide, err := filepath.Abs(c.dir)
	if err != nil {
		return nil, err
	}
	args := []string{"--data", n.Data, "--staging", n.Staging, "--criu", cfg.CRIU, "--runc", cfg.Runc,
		"--hide", hide, "agent", "--creds", filepath.Join(c.nodeDir(n.Name), "creds"), "--listen", n.Addr,
		"--coordinator", c.Coordinator, "--underlay", underlay.String(), "--netns-prefix", n.Name + "-"}
	if cfg.HealthCmd != "" {
		args = append(args, "--health-cmd", cfg.HealthCmd)
	}
	if cfg.HealthEvery > 0 {
		args = append(args, "--health-every", cfg.HealthEvery.String())
	}
	if cfg.MetricsTokenFile != "" {
		args = append(args, "--metrics-token-file", cfg.MetricsTokenFile)
	}
	return args, nil
}

// client is a client of the testbed's coordinators, as the CLI's.
func (c *Cluster) client() (*rpc.CoordClient, error) {
	creds, err := pki.LoadCredentials(c.ClientCreds())
	if err != nil {
		return nil, err
	}
	return rpc.NewCoordClient(c.Coordinator, creds), nil
}

// waitJoined waits until the coordinator sees every node alive.
func (c *Cluster) waitJoined(ctx context.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	deadline := time.Now().Add(joinWithin)
	for {
		nodes, err := cl.Nodes(ctx)
		alive := 0
		for _, nd := range nodes {
			if nd.Alive {
				alive++
			}
		}
		if err == nil && alive == len(c.Nodes) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d nodes joined within 60s (%v); see the logs in %s", alive, len(c.Nodes), err, c.dir)
		}
		for _, p := range c.PIDs() {
			if !Running(p) {
				return fmt.Errorf("a cluster process (pid %d) exited; see the logs in %s", p, c.dir)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dashboardURL is the dashboard's URL on listen, a loopback address; port
// 0 takes a free port now, so that the coordinator keeps it when it is
// restarted.
func dashboardURL(listen string) (string, error) {
	ap, err := netip.ParseAddrPort(listen)
	if err != nil || !ap.Addr().IsLoopback() {
		return "", configError{fmt.Errorf("dashboard address %q: want a loopback address and port", listen)}
	}
	if ap.Port() == 0 {
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return "", err
		}
		ap = netip.MustParseAddrPort(ln.Addr().String())
		ln.Close()
	}
	return "http://" + ap.String() + "/ui/", nil
}
