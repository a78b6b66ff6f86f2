package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/agent"
	"github.com/cairn-hpc/cairn/internal/launch"
)

func newAgentCmd() *cobra.Command {
	var listen, creds, coordAddr, underlay, underlayDev, advertise, netnsPrefix string
	var labels, cpu []string
	var healthCmd string
	var healthEvery, renewBefore time.Duration
	var minDisk, minMem float64
	var toolsDir, mpichFix, keepImages, tokenFile string
	var selfFence string
	var d daemonFlags
	cmd := &cobra.Command{
		Use:   "agent --creds DIR [--listen ADDR] [--coordinator ADDR --underlay IP]",
		Short: "Serve this node's containers and checkpoints over the agent API (mutual TLS)",
		Long: `Run the node agent in the foreground: it serves this node's containers,
checkpoints and restores (the data dir of --data) over the agent API
(api/agent/v1: JSON over HTTPS, TLS 1.3 with client certificates). DIR holds
the node's credentials from 'cairn node cert NAME --role agent -o DIR'. Only
the cluster's coordinator and clients may call it; other agents may only read
checkpoint images. GET /metrics serves the node's Prometheus metrics to them
(or to --metrics-token-file's token).

With --coordinator the agent joins the cluster as the node its certificate
names and keeps its membership alive with heartbeats: a node silent for the
coordinator's TTL is dead. --underlay is the address other nodes reach this
one at, over which job networks (VXLAN) run, out of the device that holds
it (--underlay-dev to name another). A job network takes VXLAN only from
the nodes that run the job's other ranks; where hosts or users that are
not trusted share the network between nodes, put --underlay on an
authenticated tunnel (WireGuard, IPsec) between the nodes.

Health probes run every --health-every: free disk of the data dir, available
memory, and --health-cmd (a shell command with CAIRN_NODE set, failing when
the node is unwell). Failing probes go with the heartbeats; the coordinator
publishes them as health.warning events and acts by each job's
--on-health-warning policy (migrate its ranks away, checkpoint, or ignore).

With --self-fence on, a node cut off from the coordinators fences
itself: once none has answered for half the node TTL, the agent freezes
the node's ranks (the coordinator may restart them elsewhere once the
node's lease expires), and thaws or stops each as the coordinator says
when it hears one again. An outage of every coordinator then freezes the
jobs until one is back, which is why auto (the default) fences only an
agent given several coordinators, whose outage is unlikely. Without it,
ranks run on while no coordinator answers, and those a restart brought
back elsewhere meanwhile are stopped once the node is heard again (a copy
may run twice in between).

After a checkpoint the rank's newest image stays in staging, up to
--keep-images in all: a restore of that checkpoint on this node (a job
restarted where its ranks were) then reads nothing from the store.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if creds == "" {
				return usageError{errors.New("--creds DIR is required")}
			}
			log, err := d.logger(os.Stderr)
			if err != nil {
				return err
			}
			cfg := agent.Config{Creds: creds, Listen: listen, Coordinator: coordAddr, Advertise: advertise, HealthListen: d.healthListen,
				NetnsPrefix: netnsPrefix, Labels: map[string]string{}, ToolsDir: toolsDir, MPICHFix: mpichFix, MetricsTokenFile: tokenFile,
				RenewBefore: renewBefore, CPU: cpu,
				Health: agent.HealthConfig{Every: healthEvery, MinFreeDisk: minDisk / 100, MinFreeMemory: minMem / 100, Command: healthCmd},
				Logger: log}
			switch selfFence {
			case "on":
				cfg.SelfFence = true
			case "auto":
				cfg.SelfFence = strings.Contains(coordAddr, ",")
			case "off":
			default:
				return usageError{fmt.Errorf("--self-fence %q: want auto, on or off", selfFence)}
			}
			if coordAddr != "" {
				if underlay == "" {
					return usageError{errors.New("--underlay IP is required with --coordinator")}
				}
				if cfg.Underlay, err = netip.ParseAddr(underlay); err != nil {
					return usageError{fmt.Errorf("--underlay: %w", err)}
				}
				cfg.UnderlayDev = underlayDev
			} else if underlayDev != "" {
				return usageError{errors.New("--underlay-dev is for an agent that joins a cluster (--coordinator)")}
			}
			for _, kv := range labels {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return usageError{fmt.Errorf("--label %q: want KEY=VALUE", kv)}
				}
				cfg.Labels[k] = v
			}
			global.keepImages = keepImages
			if cfg.Container, err = containerOptions(); err != nil {
				return err
			}
			if !global.debug {
				// What its containers went through (a dump tried again, a
				// lazy restore's end) is the agent's to tell.
				cfg.Container.Logger = cfg.Logger
			}
			a, err := agent.New(cfg)
			if err != nil {
				return err
			}
			return a.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:7420", "address to serve on")
	f.StringVar(&creds, "creds", "", "directory with the node's credentials (required)")
	f.StringVar(&coordAddr, "coordinator", os.Getenv("CAIRN_COORDINATOR"), "join the cluster of the coordinator at ADDR, or of several at ADDR,ADDR,... (the leader among them answers) ($CAIRN_COORDINATOR)")
	f.StringVar(&underlay, "underlay", "", "this node's address between nodes (required with --coordinator)")
	f.StringVar(&underlayDev, "underlay-dev", "", "device job networks' VXLAN goes out of (default: the one holding --underlay)")
	f.StringVar(&advertise, "advertise", "", "agent API address the coordinator calls (default: --listen)")
	f.StringVar(&healthCmd, "health-cmd", "", "health probe: a shell command (CAIRN_NODE set) that fails when the node is unwell")
	f.StringVar(&selfFence, "self-fence", "auto", "freeze this node's ranks while no coordinator answers (for half the node TTL), until one says which still belong here: on, off, or auto (on with several coordinators)")
	f.DurationVar(&healthEvery, "health-every", 5*time.Second, "how often the health probes run")
	f.Float64Var(&minDisk, "health-min-free-disk", 5, "health probe: percent of the data dir's disk that must stay free (0: off)")
	f.Float64Var(&minMem, "health-min-free-memory", 5, "health probe: percent of memory that must stay available (0: off)")
	f.StringVar(&netnsPrefix, "netns-prefix", "", "name prefix of rank network namespaces (default cairn-NODE-)")
	f.StringArrayVar(&labels, "label", nil, "node label KEY=VALUE, e.g. rack=r1 (repeatable)")
	f.StringVar(&tokenFile, "metrics-token-file", "", "a bearer token (at least 16 bytes) that lets a scraper without a client certificate GET /metrics, and nothing else")
	f.StringSliceVar(&cpu, "cpu-features", nil, "the CPU features this node declares, comma-separated, instead of those /proc/cpuinfo lists (a cluster's common subset, say): ranks that started on a node with more are not placed here")
	f.DurationVar(&renewBefore, "renew-before", agent.DefaultRenewBefore, "ask the coordinator to renew this node's certificate once it expires within this (it must hold the CA: coordinator --ca); 0: never")
	f.StringVar(&keepImages, "keep-images", envOr("CAIRN_KEEP_IMAGES", "1G"), "staging the node may use to keep each rank's newest image after its checkpoint, so that a restore of it here reads no store; 0 keeps none ($CAIRN_KEEP_IMAGES)")
	f.StringVar(&toolsDir, "tools-dir", filepath.Join(prefix(), "tools"), "where the tools mounted in MPI ranks (this cairn binary, the MPICH fix) are kept, by content")
	f.StringVar(&mpichFix, "mpich-fix", filepath.Join(prefix(), "lib", launch.MPICHFix), "the library preloaded into MPICH processes (built by make setup; see docs/mpi.md)")
	d.add(f)
	nameVars(f, "CAIRN_AGENT_")
	return cmd
}
