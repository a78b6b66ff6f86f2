package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"cairn/internal/catalog"
	"cairn/internal/container"
	"cairn/internal/coord"
	"cairn/internal/durable"
	"cairn/internal/events"
	"cairn/internal/netw"
	"cairn/internal/pki"
	"cairn/internal/rpc"
)

func newCoordinatorCmd() *cobra.Command {
	var listen, creds, dir, etcd string
	var deadline, ttl time.Duration
	var jobSubnets string
	var hookSpecs []string
	var hookSecretFile, hookCA string
	var etcdTLS catalog.TLSFiles
	cmd := &cobra.Command{
		Use:   "coordinator --creds DIR --dir DIR [--listen ADDR] [--etcd URLS] [--hook TYPE=TARGET]...",
		Short: "Run the cluster coordinator (catalog in etcd, checkpoint rounds, restarts)",
		Long: `Run the coordinator in the foreground. It keeps the catalog (nodes, jobs,
global checkpoints) in etcd: an embedded single-member etcd in DIR/etcd by
default, or the cluster given by --etcd (comma-separated client URLs). The
embedded etcd opens no TCP port: the coordinator, its only client, reaches
it through a unix socket in DIR/etcd (mode 0700). An external etcd is
reached over https:// with --etcd-cacert, --etcd-cert and --etcd-key; plain
http:// is refused but to a loopback address. The coordinator places
ranks, runs the two-phase commit of global checkpoints and whole-job
restarts, and on start finishes any round a previous coordinator left.
Credentials: 'cairn node cert coordinator --role coordinator -o DIR'.

Events (see 'cairn events') are kept in DIR/events.jsonl. Each --hook runs
for the events of a type (or family: checkpoint.*, or *): exec:COMMAND gets
the event as JSON on stdin and CAIRN_EVENT_TYPE/JOB/NODE/SEQ in its
environment; it runs in a process group of its own, all of which is killed
at the timeout (10 s) and when the command ends. An http(s) URL gets it
POSTed: https:// servers are verified with the system's roots and
--hook-ca, and with --hook-secret-file FILE (or $CAIRN_HOOK_SECRET) every
POST is signed: X-Cairn-Timestamp is the time in Unix seconds and
X-Cairn-Signature is "sha256=" and the hex HMAC-SHA256, under the secret,
of the timestamp, a dot and the body (docs/security.md tells how to verify
it). A failed delivery is retried (4 attempts, backoff from 0.5 s) and
then reported as a hook.failed event; hooks never hold the cluster up.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if creds == "" || dir == "" {
				return usageError{errors.New("--creds DIR and --dir DIR are required")}
			}
			c, err := pki.LoadCredentials(creds)
			if err != nil {
				return err
			}
			if c.Role != pki.Coordinator {
				return fmt.Errorf("credentials in %s are for a %s, not the coordinator", creds, c.Role)
			}
			subnets, err := netip.ParsePrefix(jobSubnets)
			if err != nil || subnets.Bits() > 24 || !subnets.Addr().Is4() {
				return usageError{fmt.Errorf("--job-subnets %q: want an IPv4 prefix of /24 or shorter", jobSubnets)}
			}
			var hooks []events.Hook
			for _, spec := range hookSpecs {
				h, err := events.ParseHook(spec)
				if err != nil {
					return usageError{fmt.Errorf("--hook: %w", err)}
				}
				hooks = append(hooks, h)
			}
			secret, err := hookSecret(hookSecretFile)
			if err != nil {
				return err
			}
			roots, err := events.HookRoots(hookCA)
			if err != nil {
				return usageError{fmt.Errorf("--hook-ca: %w", err)}
			}
			var catCfg catalog.Config
			if etcd != "" {
				if catCfg, err = catalog.ExternalConfig(strings.Split(etcd, ","), etcdTLS); err != nil {
					return usageError{fmt.Errorf("--etcd: %w", err)}
				}
			} else if etcdTLS != (catalog.TLSFiles{}) {
				return usageError{errors.New("--etcd-cacert, --etcd-cert and --etcd-key are for an external etcd (--etcd)")}
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			ctx := cmd.Context()
			for _, ep := range catCfg.Endpoints {
				if strings.HasPrefix(ep, "http://") {
					log.Warn("etcd without TLS: every user of this machine can reach it unless it requires authentication", "etcd", ep)
				}
			}
			for _, h := range hooks {
				if h.URL != "" && len(secret) == 0 {
					log.Warn("HTTP hook without a signature: give --hook-secret-file or $CAIRN_HOOK_SECRET", "hook", h.String())
				}
			}
			desc := etcd
			if etcd == "" {
				// A coordinator restarted right after the old one died may
				// find the old one still letting go of its etcd dir.
				var e *catalog.Embedded
				for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
					e, err = catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: filepath.Join(dir, "etcd")})
					if !errors.Is(err, catalog.ErrLocked) || time.Since(start) > 10*time.Second {
						break
					}
				}
				if err != nil {
					return err
				}
				defer e.Close()
				catCfg, desc = catalog.Config{Endpoints: e.Endpoints()}, "embedded"
			}
			cat, err := catalog.Open(ctx, catCfg)
			if err != nil {
				return err
			}
			defer cat.Close()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			log.Info("coordinator serving", "addr", ln.Addr().String(), "cluster", c.ClusterID, "etcd", desc)
			ev, err := events.New(events.Options{File: filepath.Join(dir, "events.jsonl"), Logger: log})
			if err != nil {
				return err
			}
			defer ev.Close()
			hctx, stopHooks := context.WithCancel(ctx)
			hooksDone := make(chan struct{})
			go func() {
				events.RunHooks(hctx, ev, hooks, events.HookOptions{Secret: secret, RootCAs: roots})
				close(hooksDone)
			}()
			defer func() { stopHooks(); <-hooksDone }()
			co := coord.New(cat, c, log, coord.Options{Deadline: deadline, NodeTTL: ttl, JobSubnets: subnets, EtcdDesc: desc, Events: ev})
			return co.Run(ctx, ln)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:7400", "address to serve on")
	f.StringVar(&creds, "creds", "", "directory with the coordinator's credentials (required)")
	f.StringVar(&dir, "dir", "", "directory for the coordinator's state (the embedded etcd) (required)")
	f.StringVar(&etcd, "etcd", "", "use this etcd cluster (comma-separated client URLs: https://, or http:// to a loopback address) instead of an embedded one")
	f.StringVar(&etcdTLS.CA, "etcd-cacert", "", "CA certificate (PEM) that verifies the --etcd servers (default: the system's roots)")
	f.StringVar(&etcdTLS.Cert, "etcd-cert", "", "client certificate (PEM) for the --etcd cluster")
	f.StringVar(&etcdTLS.Key, "etcd-key", "", "key (PEM) of --etcd-cert")
	f.DurationVar(&deadline, "deadline", coord.DefaultDeadline, "time every rank has to prepare in a checkpoint round")
	f.DurationVar(&ttl, "node-ttl", coord.DefaultNodeTTL, "a node silent for this long is dead")
	f.StringVar(&jobSubnets, "job-subnets", coord.DefaultJobSubnets.String(), "range the /24 subnets of jobs are taken from")
	f.StringArrayVar(&hookSpecs, "hook", nil, "run for events of TYPE: TYPE=exec:COMMAND or TYPE=http(s)://URL (repeatable)")
	f.StringVar(&hookSecretFile, "hook-secret-file", "", "sign HTTP hooks with the secret in this file (at least 16 bytes; default $CAIRN_HOOK_SECRET)")
	f.StringVar(&hookCA, "hook-ca", "", "CA certificates (PEM) that verify https:// hooks, besides the system's roots")
	return cmd
}

// hookSecret returns the secret that signs HTTP hooks: the content of
// file without its final newline, or $CAIRN_HOOK_SECRET; none is nil.
func hookSecret(file string) ([]byte, error) {
	secret := os.Getenv("CAIRN_HOOK_SECRET")
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, usageError{fmt.Errorf("--hook-secret-file: %w", err)}
		}
		secret = strings.TrimRight(string(b), "\r\n")
	}
	if secret == "" {
		return nil, nil
	}
	if len(secret) < 16 {
		return nil, usageError{errors.New("the hook secret is shorter than 16 bytes")}
	}
	return []byte(secret), nil
}

// localCluster is what `cairn up` records in DATA/cluster/cluster.json:
// enough for the CLI to find the coordinator and for `cairn down` to
// remove everything.
type localCluster struct {
	Prefix      string      `json:"prefix"`
	Underlay    string      `json:"underlay"`
	Coordinator string      `json:"coordinator"`
	CoordPID    int         `json:"coordinator_pid"`
	Nodes       []localNode `json:"nodes"`
	Created     time.Time   `json:"created"`
}

type localNode struct {
	Name    string `json:"name"`
	Addr    string `json:"addr"`
	Data    string `json:"data"`
	Staging string `json:"staging"`
	PID     int    `json:"pid"`
}

func clusterDir() string { return filepath.Join(global.dataDir, "cluster") }

func loadLocalCluster() (*localCluster, error) {
	b, err := os.ReadFile(filepath.Join(clusterDir(), "cluster.json"))
	if err != nil {
		return nil, err
	}
	var lc localCluster
	if err := json.Unmarshal(b, &lc); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(clusterDir(), "cluster.json"), err)
	}
	return &lc, nil
}

// coordFlags are how the CLI finds a coordinator.
var coordFlags struct {
	addr  string
	creds string
}

// errNoCluster says that no coordinator is configured.
var errNoCluster = errors.New("no cluster: start one with `cairn up`, or give --coordinator ADDR and --creds DIR")

// coordClient returns a client of the configured coordinator: the one of
// --coordinator ($CAIRN_COORDINATOR) with --creds ($CAIRN_CREDS), or the
// local cluster `cairn up` made.
func coordClient() (*rpc.CoordClient, error) {
	addr, creds := coordFlags.addr, coordFlags.creds
	if addr == "" {
		lc, err := loadLocalCluster()
		if errors.Is(err, os.ErrNotExist) {
			return nil, errNoCluster
		}
		if err != nil {
			return nil, err
		}
		addr = lc.Coordinator
		if creds == "" {
			creds = filepath.Join(clusterDir(), "client")
		}
	}
	if creds == "" {
		return nil, usageError{errors.New("--creds DIR (client credentials) is required with --coordinator")}
	}
	c, err := pki.LoadCredentials(creds)
	if err != nil {
		return nil, err
	}
	return rpc.NewCoordClient(addr, c), nil
}

func newUpCmd() *cobra.Command {
	var nodes int
	var prefix, underlay, jobSubnets string
	var deadline, ttl time.Duration
	var extra upExtra
	cmd := &cobra.Command{
		Use:   "up [--nodes N]",
		Short: "Start a local cluster: a coordinator and N agents, each node in its own network namespace",
		Long: `Start a cluster on this machine: a coordinator (with an embedded etcd) on the
host and N agents, each in a network namespace of its own (a "node", with its
own data dir in DATA/cluster/nodes/NAME and its own bridges), joined by veths
to a host bridge that plays the physical network. A fresh CA signs every
credential. The CLI finds this cluster without flags; 'cairn down' removes
all of it.`,
		Example: `  cairn up --nodes 3
  cairn run --job sim --ranks 4 -- /usr/bin/my-solver
  cairn down`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if nodes < 1 || nodes > 64 {
				return usageError{fmt.Errorf("--nodes must be 1..64")}
			}
			sub, err := netip.ParsePrefix(underlay)
			if err != nil {
				return usageError{fmt.Errorf("--underlay: %w", err)}
			}
			for _, h := range extra.hooks {
				if _, err := events.ParseHook(h); err != nil {
					return usageError{fmt.Errorf("--hook: %w", err)}
				}
			}
			// The coordinator reads them once it runs: check them now, and
			// hand it paths that do not depend on this directory.
			if _, err := hookSecret(extra.hookSecretFile); err != nil {
				return err
			}
			if _, err := events.HookRoots(extra.hookCA); err != nil {
				return usageError{fmt.Errorf("--hook-ca: %w", err)}
			}
			for _, p := range []*string{&extra.hookSecretFile, &extra.hookCA} {
				if *p != "" {
					if *p, err = filepath.Abs(*p); err != nil {
						return err
					}
				}
			}
			return clusterUp(cmd.Context(), cmd, nodes, prefix, sub, jobSubnets, deadline, ttl, extra)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&extra.hooks, "hook", nil, "the coordinator's event hooks, TYPE=exec:COMMAND or TYPE=http(s)://URL (repeatable; see 'cairn coordinator --help')")
	f.StringVar(&extra.hookSecretFile, "hook-secret-file", "", "the coordinator's --hook-secret-file (default $CAIRN_HOOK_SECRET)")
	f.StringVar(&extra.hookCA, "hook-ca", "", "the coordinator's --hook-ca")
	f.StringVar(&extra.healthCmd, "health-cmd", "", "every agent's health probe command (see 'cairn agent --help')")
	f.DurationVar(&extra.healthEvery, "health-every", 0, "how often agents run their health probes (default: the agent's)")
	f.IntVar(&nodes, "nodes", 3, "number of nodes")
	f.StringVar(&prefix, "prefix", "cl-", "name prefix of the cluster's namespaces, bridges and nodes")
	f.StringVar(&underlay, "underlay", "10.212.0.0/24", "subnet of the network between nodes")
	f.StringVar(&jobSubnets, "job-subnets", coord.DefaultJobSubnets.String(), "range the /24 subnets of jobs are taken from")
	f.DurationVar(&deadline, "deadline", coord.DefaultDeadline, "time every rank has to prepare in a checkpoint round")
	f.DurationVar(&ttl, "node-ttl", coord.DefaultNodeTTL, "a node silent for this long is dead")
	return cmd
}

// coordPort and agentPort are the local cluster's service ports.
const (
	coordPort = 7400
	agentPort = 7420
)

// upExtra are the options of `cairn up` handed on to the coordinator and
// the agents.
type upExtra struct {
	hooks          []string
	hookSecretFile string
	hookCA         string
	healthCmd      string
	healthEvery    time.Duration
}

func clusterUp(ctx context.Context, cmd *cobra.Command, n int, prefix string, underlay netip.Prefix, jobSubnets string, deadline, ttl time.Duration, extra upExtra) (err error) {
	out := cmd.OutOrStdout()
	dir := clusterDir()
	if _, err := os.Stat(filepath.Join(dir, "cluster.json")); err == nil {
		return fmt.Errorf("a local cluster exists (%s); remove it with `cairn down` first", dir)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cl, err := netw.NewCluster(prefix, underlay, n)
	if err != nil {
		return usageError{err}
	}
	cl.HostAddr = true
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	lc := &localCluster{Prefix: prefix, Underlay: underlay.String(), Created: time.Now().UTC(),
		Coordinator: netip.AddrPortFrom(cl.Underlay.Gateway(), coordPort).String()}
	save := func() error {
		b, _ := json.MarshalIndent(lc, "", "  ")
		return durable.WriteFile(filepath.Join(dir, "cluster.json"), b, 0o600)
	}
	// From here on, whatever fails takes everything down again.
	if err := save(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = clusterDown(context.WithoutCancel(ctx), lc, nil)
		}
	}()
	ca, err := pki.Init(filepath.Join(dir, "pki"), pki.InitOptions{Force: true})
	if err != nil {
		return err
	}
	issue := func(name string, role pki.Role, to string, ips ...net.IP) error {
		c, err := ca.Issue(name, role, pki.IssueOptions{IPs: ips})
		if err != nil {
			return err
		}
		return c.Write(to)
	}
	if err := issue(rpc.CoordServerName, pki.Coordinator, filepath.Join(dir, "coordinator", "creds"), net.IP(cl.Underlay.Gateway().AsSlice())); err != nil {
		return err
	}
	if err := issue("client", pki.Client, filepath.Join(dir, "client")); err != nil {
		return err
	}
	if err := cl.Create(ctx); err != nil {
		return err
	}
	// The coordinator, on the host.
	coordArgs := []string{"--data", filepath.Join(dir, "coordinator"), "coordinator",
		"--creds", filepath.Join(dir, "coordinator", "creds"), "--dir", filepath.Join(dir, "coordinator"),
		"--listen", lc.Coordinator, "--job-subnets", jobSubnets,
		"--deadline", deadline.String(), "--node-ttl", ttl.String()}
	for _, h := range extra.hooks {
		coordArgs = append(coordArgs, "--hook", h)
	}
	if extra.hookSecretFile != "" {
		coordArgs = append(coordArgs, "--hook-secret-file", extra.hookSecretFile)
	}
	if extra.hookCA != "" {
		coordArgs = append(coordArgs, "--hook-ca", extra.hookCA)
	}
	pid, err := spawn(filepath.Join(dir, "coordinator", "coordinator.log"), nil, exe, coordArgs...)
	if err != nil {
		return err
	}
	lc.CoordPID = pid
	if err := save(); err != nil {
		return err
	}
	fmt.Fprintf(out, "coordinator at %s (pid %d)\n", lc.Coordinator, pid)
	// The agents, one in each node's network namespace.
	for _, node := range cl.Nodes {
		nd := filepath.Join(dir, "nodes", node.Name)
		ln := localNode{Name: node.Name, Addr: netip.AddrPortFrom(node.Addr, agentPort).String(),
			Data: filepath.Join(nd, "data"), Staging: filepath.Join(global.stagingDir, node.Name)}
		if err := issue(node.Name, pki.Agent, filepath.Join(nd, "creds"), net.IP(node.Addr.AsSlice())); err != nil {
			return err
		}
		// Ranks see nothing of the cluster dir: the CA key, every node's
		// credentials and data, the coordinator's.
		hide, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		agentArgs := []string{"--data", ln.Data, "--staging", ln.Staging, "--criu", global.criuPath, "--runc", global.runcPath,
			"--hide", hide, "agent", "--creds", filepath.Join(nd, "creds"), "--listen", ln.Addr,
			"--coordinator", lc.Coordinator, "--underlay", node.Addr.String(), "--netns-prefix", node.Name + "-"}
		if extra.healthCmd != "" {
			agentArgs = append(agentArgs, "--health-cmd", extra.healthCmd)
		}
		if extra.healthEvery > 0 {
			agentArgs = append(agentArgs, "--health-every", extra.healthEvery.String())
		}
		pid, err := spawn(filepath.Join(nd, "agent.log"), []string{"nsenter", "--net=" + node.Path(), "--"}, exe, agentArgs...)
		if err != nil {
			return err
		}
		ln.PID = pid
		lc.Nodes = append(lc.Nodes, ln)
		if err := save(); err != nil {
			return err
		}
	}
	// Ready when every node has joined.
	c, err := coordClient()
	if err != nil {
		return err
	}
	defer c.Close()
	deadlineAt := time.Now().Add(60 * time.Second)
	for {
		nodes, err := c.Nodes(ctx)
		alive := 0
		for _, nd := range nodes {
			if nd.Alive {
				alive++
			}
		}
		if err == nil && alive == n {
			break
		}
		if time.Now().After(deadlineAt) {
			return fmt.Errorf("only %d of %d nodes joined within 60s (%v); see the logs in %s", alive, n, err, dir)
		}
		for _, p := range append([]int{lc.CoordPID}, nodePIDs(lc)...) {
			if !pidRuns(p) {
				return fmt.Errorf("a cluster process (pid %d) exited; see the logs in %s", p, dir)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, nd := range lc.Nodes {
		fmt.Fprintf(out, "node %s: agent at %s (pid %d)\n", nd.Name, nd.Addr, nd.PID)
	}
	fmt.Fprintf(out, "cluster up: %d nodes (state and logs in %s; remove with `cairn down`)\n", n, dir)
	return nil
}

func nodePIDs(lc *localCluster) []int {
	var pids []int
	for _, n := range lc.Nodes {
		pids = append(pids, n.PID)
	}
	return pids
}

func pidRuns(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie has exited.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// spawn starts a detached process (its own session, output to logPath)
// and returns its pid.
func spawn(logPath string, wrapper []string, exe string, args ...string) (int, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err != nil {
		return 0, err
	}
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer lf.Close()
	argv := append(append(wrapper, exe), args...)
	c := exec.Command(argv[0], argv[1:]...)
	c.Stdout, c.Stderr = lf, lf
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		return 0, err
	}
	pid := c.Process.Pid
	go func() { _ = c.Wait() }() // reap it if it exits while this process lives
	return pid, nil
}

func newDownCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove the local cluster made by `cairn up`: processes, containers, namespaces, data",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			lc, err := loadLocalCluster()
			if errors.Is(err, os.ErrNotExist) {
				fmt.Fprintln(cmd.OutOrStdout(), "no local cluster")
				return nil
			}
			if err != nil {
				return err
			}
			if err := clusterDown(cmd.Context(), lc, cmd.OutOrStdout()); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "cluster down")
			return nil
		},
	}
}

// stopPID ends a process this cluster started: SIGTERM, then SIGKILL.
func stopPID(pid int) {
	if !pidRuns(pid) {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 50 && pidRuns(pid); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if pidRuns(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 50 && pidRuns(pid); i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// clusterDown stops the agents, removes every container of every node,
// the namespaces and links named with the cluster's prefix, stops the
// coordinator and deletes the cluster's directory.
func clusterDown(ctx context.Context, lc *localCluster, out interface{ Write([]byte) (int, error) }) error {
	var errs []error
	for _, n := range lc.Nodes {
		stopPID(n.PID)
	}
	for _, n := range lc.Nodes {
		if _, err := os.Stat(n.Data); err != nil {
			continue
		}
		m, err := container.New(container.Options{DataDir: n.Data, StagingDir: n.Staging, CRIU: global.criuPath, Runc: global.runcPath})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		list, err := m.List(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for _, in := range list {
			if err := m.Remove(ctx, in.Name, true); err != nil {
				errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
			}
		}
		_ = os.RemoveAll(n.Staging)
	}
	stopPID(lc.CoordPID)
	if err := netw.Cleanup(ctx, lc.Prefix); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster down (state kept in %s): %w", clusterDir(), err)
	}
	return os.RemoveAll(clusterDir())
}

func newNodeFailCmd() *cobra.Command {
	var loseData bool
	cmd := &cobra.Command{
		Use:   "fail NODE [--lose-data]",
		Short: "Local clusters only: make a node fail (its agent and containers killed)",
		Long: `Simulate the failure of a node of the local cluster made by 'cairn up': its
agent and every container on it are killed (SIGKILL), as if the machine had
stopped; with --lose-data its data dir (its checkpoint images) is deleted
too. The coordinator sees the node dead once its lease expires.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lc, err := loadLocalCluster()
			if errors.Is(err, os.ErrNotExist) {
				return errNoCluster
			}
			if err != nil {
				return err
			}
			for _, n := range lc.Nodes {
				if n.Name == args[0] {
					return failNode(cmd.Context(), n, loseData)
				}
			}
			return usageError{fmt.Errorf("no node %s in the local cluster", args[0])}
		},
	}
	cmd.Flags().BoolVar(&loseData, "lose-data", false, "delete the node's data dir too")
	return cmd
}

// failNode kills a local node's agent and containers, and with loseData
// deletes its data.
func failNode(ctx context.Context, n localNode, loseData bool) error {
	if pidRuns(n.PID) {
		if err := syscall.Kill(n.PID, syscall.SIGKILL); err != nil {
			return err
		}
		for pidRuns(n.PID) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	m, err := container.New(container.Options{DataDir: n.Data, StagingDir: n.Staging, CRIU: global.criuPath, Runc: global.runcPath})
	if err != nil {
		return err
	}
	list, err := m.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, in := range list {
		errs = append(errs, m.Remove(ctx, in.Name, true))
	}
	if loseData {
		errs = append(errs, os.RemoveAll(n.Data), os.RemoveAll(n.Staging))
	}
	return errors.Join(errs...)
}
