package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/control"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/events"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/testbed"
)

func newCoordinatorCmd() *cobra.Command {
	var listen, creds, dir, etcd, uiListen, uiToken, tokenFile, caDir string
	var name, peers, advertise string
	var deadline, ttl, mtbf time.Duration
	var jobSubnets string
	var hf hookFlags
	var etcdTLS catalog.TLSFiles
	var d daemonFlags
	cmd := &cobra.Command{
		Use:   "coordinator --creds DIR --dir DIR [--listen ADDR] [--name NAME --peers NAME=URL,...] [--etcd URLS] [--hook TYPE=TARGET]...",
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
Credentials: 'cairn node cert coordinator --role coordinator -o DIR'. GET
/metrics serves Prometheus metrics to clients (or --metrics-token-file's token).

Several coordinators (an odd number) keep one cluster alive when one of
them is lost: each runs with --name and the same --peers, every
coordinator's name and etcd peer URL (https://IP:PORT, with the IP among
its certificate's), and their embedded etcds form one cluster over mutual
TLS (or all share an external --etcd). One leads, chosen by etcd's
election; the others stand by and send clients to it, and one of them
takes over when the leader stops, finishing what it left. Agents and the
CLI take every coordinator's address (--coordinator A,B,C). A deposed
leader that still runs can change nothing: its catalog writes and its
calls to agents are refused (docs/protocols.md, "Leadership").

Events (see 'cairn events') are kept in DIR/events.jsonl. Each --hook runs
for the events of a type (or family: checkpoint.*, or *): exec:COMMAND gets
the event as JSON on stdin and CAIRN_EVENT_TYPE/JOB/NODE/SEQ in its
environment, with PATH, HOME, the locale and nothing else of the
coordinator's (set what it needs in COMMAND); it runs in a process group of its own, all of which is killed
at the timeout (10 s) and when the command ends. An http(s) URL gets it
POSTed: https:// servers are verified with the system's roots and
--hook-ca, and with --hook-secret-file FILE (or $CAIRN_HOOK_SECRET) every
POST is signed: X-Cairn-Timestamp is the time in Unix seconds and
X-Cairn-Signature is "sha256=" and the hex HMAC-SHA256, under the secret,
of the timestamp, a dot and the body (docs/security.md tells how to verify
it). A failed delivery is retried (4 attempts, backoff from 0.5 s) and
then reported as a hook.failed event; hooks never hold the cluster up.

The API serves a read-only dashboard at /ui/ to client certificates; with
--ui-token-file FILE (its token, mode 0600) browsers get it on --ui-listen, a
loopback address, after logging in once at /ui/login (docs/cluster.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if creds == "" || dir == "" {
				return usageError{errors.New("--creds DIR and --dir DIR are required")}
			}
			subnets, err := netip.ParsePrefix(jobSubnets)
			if err != nil || subnets.Bits() > 24 || !subnets.Addr().Is4() {
				return usageError{fmt.Errorf("--job-subnets %q: want an IPv4 prefix of /24 or shorter", jobSubnets)}
			}
			hooks, secret, roots, err := hf.parse()
			if err != nil {
				return err
			}
			log, err := d.logger(os.Stderr)
			if err != nil {
				return err
			}
			cfg := control.Config{Creds: creds, Dir: dir, Listen: listen, Name: name, Advertise: advertise, HealthListen: d.healthListen,
				UIListen: uiListen, UITokenFile: uiToken, Hooks: hooks, HookSecret: secret, HookRoots: roots, MetricsTokenFile: tokenFile,
				CADir:  caDir,
				Coord:  coord.Options{Deadline: deadline, NodeTTL: ttl, JobSubnets: subnets, MTBF: mtbf},
				Logger: log}
			if peers != "" {
				if cfg.Peers, err = parsePeers(peers, name); err != nil {
					return usageError{err}
				}
				if etcd != "" {
					return usageError{errors.New("--peers are the members of an embedded etcd; an external --etcd has its own")}
				}
			}
			if etcd != "" {
				if cfg.Etcd, err = catalog.ExternalConfig(strings.Split(etcd, ","), etcdTLS); err != nil {
					return usageError{fmt.Errorf("--etcd: %w", err)}
				}
			} else if etcdTLS != (catalog.TLSFiles{}) {
				return usageError{errors.New("--etcd-cacert, --etcd-cert and --etcd-key are for an external etcd (--etcd)")}
			}
			return control.Run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:7400", "address to serve on")
	f.StringVar(&creds, "creds", "", "directory with the coordinator's credentials (required)")
	f.StringVar(&name, "name", "", "this coordinator's name among several (default: the host's name)")
	f.StringVar(&peers, "peers", "", "every coordinator's name and etcd peer URL, NAME=https://IP:PORT,... (this one's included): the embedded etcd is one member of their cluster")
	f.StringVar(&advertise, "advertise", "", "address clients reach this coordinator at, told them by the others (default: --listen's)")
	f.StringVar(&dir, "dir", "", "directory for the coordinator's state (the embedded etcd) (required)")
	f.StringVar(&etcd, "etcd", "", "use this etcd cluster (comma-separated client URLs: https://, or http:// to a loopback address) instead of an embedded one")
	f.StringVar(&etcdTLS.CA, "etcd-cacert", "", "CA certificate (PEM) that verifies the --etcd servers (default: the system's roots)")
	f.StringVar(&etcdTLS.Cert, "etcd-cert", "", "client certificate (PEM) for the --etcd cluster")
	f.StringVar(&etcdTLS.Key, "etcd-key", "", "key (PEM) of --etcd-cert")
	f.DurationVar(&deadline, "deadline", coord.DefaultDeadline, "time every rank has to prepare in a checkpoint round")
	f.DurationVar(&ttl, "node-ttl", coord.DefaultNodeTTL, "a node silent for this long is dead")
	f.DurationVar(&mtbf, "mtbf", 0, "a node's mean time between failures, for jobs with --checkpoint-every auto that give none, until enough node failures are seen to estimate it")
	f.StringVar(&jobSubnets, "job-subnets", coord.DefaultJobSubnets.String(), "range the /24 subnets of jobs are taken from")
	f.StringArrayVar(&hf.specs, "hook", nil, "run for events of TYPE: TYPE=exec:COMMAND or TYPE=http(s)://URL (repeatable)")
	f.StringVar(&hf.secretFile, "hook-secret-file", "", "sign HTTP hooks with the secret in this file (at least 16 bytes; default $CAIRN_HOOK_SECRET)")
	f.StringVar(&hf.ca, "hook-ca", "", "CA certificates (PEM) that verify https:// hooks, besides the system's roots")
	f.StringVar(&uiToken, "ui-token-file", "", "serve the read-only dashboard to browsers that log in with the token in this file")
	f.StringVar(&uiListen, "ui-listen", "127.0.0.1:7401", "loopback address the dashboard is served on with --ui-token-file")
	f.StringVar(&tokenFile, "metrics-token-file", "", "a bearer token (at least 16 bytes) that lets a scraper without a client certificate GET /metrics, and nothing else")
	f.StringVar(&caDir, "ca", "", "the cluster CA's directory (cairn init's DATA/pki): renew agents' certificates when they ask (whoever holds this coordinator's account can then mint any node's; see docs/operations.md)")
	d.add(f)
	nameVars(f, "CAIRN_COORDINATOR_")
	return cmd
}

// parsePeers reads --peers: NAME=URL,... with name among the names.
func parsePeers(s, name string) (map[string]string, error) {
	peers := map[string]string{}
	for part := range strings.SplitSeq(s, ",") {
		n, u, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || n == "" || !strings.HasPrefix(u, "https://") {
			return nil, fmt.Errorf("--peers %q: want NAME=https://IP:PORT,...", part)
		}
		if _, dup := peers[n]; dup {
			return nil, fmt.Errorf("--peers: %s given twice", n)
		}
		peers[n] = u
	}
	if name == "" {
		return nil, errors.New("--peers needs --name, this coordinator's among them")
	}
	if _, ok := peers[name]; !ok {
		return nil, fmt.Errorf("--peers does not name this coordinator (--name %s)", name)
	}
	if len(peers)%2 == 0 {
		return nil, fmt.Errorf("--peers names %d coordinators: want an odd number, so that a majority survives the loss of a minority", len(peers))
	}
	return peers, nil
}

// hookFlags are the coordinator's hook flags (cairn coordinator, cairn up).
type hookFlags struct {
	specs          []string
	secretFile, ca string
}

// parse checks them, and returns the hooks, the secret that signs HTTP
// ones (the content of --hook-secret-file without its final newline, or
// $CAIRN_HOOK_SECRET; none is nil) and the roots that verify https:// ones.
func (hf hookFlags) parse() (hooks []events.Hook, secret []byte, roots *x509.CertPool, err error) {
	hooks, secret, roots, err = events.HookConfig(hf.specs, hf.secretFile, os.Getenv("CAIRN_HOOK_SECRET"), hf.ca)
	if err != nil {
		return nil, nil, nil, usageError{err}
	}
	return hooks, secret, roots, nil
}

// localCluster loads the testbed of the data dir, the local cluster of
// `cairn up`: errNoCluster when there is none.
func localCluster() (*testbed.Cluster, error) {
	lc, err := testbed.Load(testbed.Dir(global.dataDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, noCluster()
	}
	return lc, err
}

// nodeRuntime are the binaries of the global flags that containers are
// managed with.
func nodeRuntime() testbed.Runtime {
	return testbed.Runtime{CRIU: global.criuPath, Runc: global.runcPath}
}

// coordFlags are how the CLI finds a coordinator.
var coordFlags struct {
	addr  string
	creds string
}

// errNoCluster says that no coordinator is configured; noCluster says
// what to do about it.
var errNoCluster = errors.New("no cluster")

func noCluster() error {
	return fmt.Errorf("%w: start one with `%s up`, or give --coordinator ADDR and --creds DIR", errNoCluster, cairnCmd())
}

// coordClient returns a client of the configured coordinator: the one of
// --coordinator ($CAIRN_COORDINATOR) with --creds ($CAIRN_CREDS), or the
// local cluster `cairn up` made.
func coordClient() (*rpc.CoordClient, error) {
	addr, creds := coordFlags.addr, coordFlags.creds
	if addr == "" {
		lc, err := localCluster()
		if err != nil {
			return nil, err
		}
		addr = lc.Coordinator
		if creds == "" {
			creds = lc.ClientCreds()
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
	var underlay string
	var offsets []string
	var asJSON bool
	var cfg testbed.Config
	cmd := &cobra.Command{
		Use:   "up [--nodes N] [--coordinators M]",
		Short: "Start a local cluster: a coordinator and N agents, each node in its own network namespace",
		Long: `Start a cluster on this machine: a coordinator (with an embedded etcd) on the
host, or M of them whose etcds form one cluster (one leads, the others stand
by to take over), and N agents, each in a network namespace of its own (a "node", with its
own data dir in DATA/cluster/nodes/NAME and its own bridges), joined by veths
to a host bridge that plays the physical network. A fresh CA signs every
credential. The CLI finds this cluster without flags; 'cairn down' removes
all of it.`,
		Example: `  cairn up --nodes 3
  cairn up --nodes 3 --coordinators 3
  cairn up --nodes 2 --clock-offset n2=240h
  cairn run --job sim --ranks 4 -- /usr/bin/my-solver
  cairn down`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cfg.Nodes < 1 || cfg.Nodes > 64 {
				return usageError{fmt.Errorf("--nodes must be 1..64")}
			}
			if cfg.MTBF < 0 {
				return usageError{fmt.Errorf("--mtbf must not be negative")}
			}
			if cfg.Coordinators < 1 || cfg.Coordinators%2 == 0 || cfg.Coordinators > 9 {
				return usageError{fmt.Errorf("--coordinators must be odd, 1..9")}
			}
			var err error
			if cfg.ClockOffsets, err = parseClockOffsets(offsets); err != nil {
				return usageError{err}
			}
			if cfg.Underlay, err = netip.ParsePrefix(underlay); err != nil {
				return usageError{fmt.Errorf("--underlay: %w", err)}
			}
			// The coordinator reads them once it runs: check them now, and
			// hand it paths that do not depend on this directory.
			hf := hookFlags{cfg.Hooks, cfg.HookSecretFile, cfg.HookCA}
			if _, _, _, err := hf.parse(); err != nil {
				return err
			}
			for _, p := range []*string{&cfg.HookSecretFile, &cfg.HookCA, &cfg.MetricsTokenFile} {
				if *p != "" {
					if *p, err = filepath.Abs(*p); err != nil {
						return err
					}
				}
			}
			cfg.Dir, cfg.Staging, cfg.CRIU, cfg.Runc, cfg.Out = testbed.Dir(global.dataDir), global.stagingDir, global.criuPath, global.runcPath, cmd.OutOrStdout()
			cfg.CLI = cairnCmd()
			if asJSON {
				cfg.Out = io.Discard
			}
			lc, err := testbed.Up(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), lc)
			}
			for _, nd := range lc.Nodes {
				fmt.Fprintf(cfg.Out, "node %s: agent at %s (pid %d)\n", nd.Name, nd.Addr, nd.PID)
			}
			fmt.Fprintf(cfg.Out, "cluster up: %d nodes (state and logs in %s; remove with `%s down`)\n", cfg.Nodes, lc.Dir(), cairnCmd())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&cfg.Hooks, "hook", nil, "the coordinator's event hooks, TYPE=exec:COMMAND or TYPE=http(s)://URL (repeatable; see 'cairn coordinator --help')")
	f.StringVar(&cfg.HookSecretFile, "hook-secret-file", "", "the coordinator's --hook-secret-file (default $CAIRN_HOOK_SECRET)")
	f.StringVar(&cfg.HookCA, "hook-ca", "", "the coordinator's --hook-ca")
	f.StringVar(&cfg.UIListen, "ui-listen", "127.0.0.1:0", "loopback address of the dashboard (port 0: a free one; \"\": none)")
	f.StringVar(&cfg.HealthCmd, "health-cmd", "", "every agent's health probe command (see 'cairn agent --help')")
	f.StringVar(&cfg.MetricsTokenFile, "metrics-token-file", "", "the coordinator's and every agent's --metrics-token-file")
	f.DurationVar(&cfg.HealthEvery, "health-every", 0, "how often agents run their health probes (default: the agent's)")
	f.IntVar(&cfg.Nodes, "nodes", 3, "number of nodes")
	f.IntVar(&cfg.Coordinators, "coordinators", 1, "number of coordinators (odd): with several, one leads and the others stand by to take over")
	f.StringVar(&cfg.Prefix, "prefix", "cl-", "name prefix of the cluster's namespaces, bridges and nodes")
	f.StringVar(&underlay, "underlay", "10.212.0.0/24", "subnet of the network between nodes")
	f.StringVar(&cfg.JobSubnets, "job-subnets", coord.DefaultJobSubnets.String(), "range the /24 subnets of jobs are taken from")
	f.DurationVar(&cfg.Deadline, "deadline", coord.DefaultDeadline, "time every rank has to prepare in a checkpoint round")
	f.DurationVar(&cfg.NodeTTL, "node-ttl", coord.DefaultNodeTTL, "a node silent for this long is dead")
	f.DurationVar(&cfg.MTBF, "mtbf", 0, "the coordinator's --mtbf: a node's mean time between failures, for --checkpoint-every auto")
	f.BoolVar(&asJSON, "json", false, "print the cluster, as cluster.json keeps it, as JSON")
	f.StringArrayVar(&offsets, "clock-offset", nil, "NODE=DURATION: NODE's monotonic and boot-time clocks run DURATION (whole seconds) ahead, as on a machine booted that much earlier (negative: later), so that restores and migrations meet what separate hosts' uptimes do (repeatable)")
	return cmd
}

// parseClockOffsets reads `up --clock-offset NODE=DURATION`s.
func parseClockOffsets(specs []string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, spec := range specs {
		node, v, ok := strings.Cut(spec, "=")
		d, err := time.ParseDuration(v)
		if !ok || node == "" || err != nil {
			return nil, fmt.Errorf("--clock-offset %q: want NODE=DURATION, as n2=240h or n2=-1h", spec)
		}
		if _, dup := out[node]; dup {
			return nil, fmt.Errorf("--clock-offset: %s given twice", node)
		}
		out[node] = d
	}
	return out, nil
}

func newDownCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove the local cluster made by `cairn up`: processes, containers, namespaces, data",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			lc, err := localCluster()
			if errors.Is(err, errNoCluster) {
				fmt.Fprintln(cmd.OutOrStdout(), "no local cluster")
				return nil
			}
			if err != nil {
				return err
			}
			if err := lc.Down(cmd.Context(), nodeRuntime()); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "cluster down")
			return nil
		},
	}
}

func newNodeFailCmd() *cobra.Command {
	var loseData bool
	cmd := &cobra.Command{
		Use:   "fail NODE [--lose-data]",
		Short: "Local clusters only: make a node fail (its agent and containers killed)",
		Long: `Simulate the failure of a node of the local cluster made by 'cairn up': its
agent, every container on it and whatever else runs in its network namespace
(runc, CRIU) are killed (SIGKILL), as if the machine had stopped, and runc's
state and the containers' cgroups are dropped; with --lose-data its data dir
(its checkpoint images) is deleted too. The coordinator sees the node dead once its lease expires; 'cairn node
revive NODE' brings it back.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lc, err := localCluster()
			if err != nil {
				return err
			}
			n, ok := lc.Node(args[0])
			if !ok {
				return usageError{fmt.Errorf("no node %s in the local cluster", args[0])}
			}
			return n.Fail(cmd.Context(), nodeRuntime(), loseData)
		},
	}
	cmd.Flags().BoolVar(&loseData, "lose-data", false, "delete the node's data dir too")
	return cmd
}

func newNodeReviveCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "revive NODE",
		Short: "Local clusters only: bring a failed node back (its agent started again)",
		Long: `Bring back a node of the local cluster made by 'cairn up' that failed ('cairn
node fail'), as a repaired machine that boots again: what it held in memory is
gone (its staging dir, the mounts under its dirs, its network namespace with
its job networks and rank namespaces, made again with only its underlay
address), its disk is as the failure left it (empty after --lose-data), and
its agent starts again with the command line 'cairn up' gave it and joins the
cluster. The command returns once the coordinator has seen the node join. A
node whose agent runs is refused.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lc, err := localCluster()
			if err != nil {
				return err
			}
			if _, ok := lc.Node(args[0]); !ok {
				return usageError{fmt.Errorf("no node %s in the local cluster", args[0])}
			}
			n, err := lc.Revive(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), n)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s back: agent at %s (pid %d)\n", n.Name, n.Addr, n.PID)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the node, as the local cluster keeps it, as JSON")
	return cmd
}

// withCoord calls fn with a client of the configured coordinator, and
// closes it after.
func withCoord(fn func(c *rpc.CoordClient) error) error {
	c, err := coordClient()
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c)
}
