package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	agentv1 "cairn/api/agent/v1"
	coordv1 "cairn/api/coord/v1"
	"cairn/internal/agent"
	"cairn/internal/container"
	"cairn/internal/launch"
	"cairn/internal/netw"
	"cairn/internal/pki"
	"cairn/internal/rpc"
)

func newAgentCmd() *cobra.Command {
	var listen, creds, coordAddr, underlay, advertise, netnsPrefix string
	var labels []string
	var healthCmd string
	var healthEvery time.Duration
	var minDisk, minMem float64
	var toolsDir, mpichFix, keepImages string
	cmd := &cobra.Command{
		Use:   "agent --creds DIR [--listen ADDR] [--coordinator ADDR --underlay IP]",
		Short: "Serve this node's containers and checkpoints over the agent API (mutual TLS)",
		Long: `Run the node agent in the foreground: it serves this node's containers,
checkpoints and restores (the data dir of --data) over the agent API
(api/agent/v1: JSON over HTTPS, TLS 1.3 with client certificates). DIR holds
the node's credentials from 'cairn node cert NAME --role agent -o DIR'. Only
the cluster's coordinator and clients may call it; other agents may only read
checkpoint images.

With --coordinator the agent joins the cluster as the node its certificate
names and keeps its membership alive with heartbeats: a node silent for the
coordinator's TTL is dead. --underlay is the address other nodes reach this
one at, over which job networks (VXLAN) run.

Health probes run every --health-every: free disk of the data dir, available
memory, and --health-cmd (a shell command with CAIRN_NODE set, failing when
the node is unwell). Failing probes go with the heartbeats; the coordinator
publishes them as health.warning events and acts by each job's
--on-health-warning policy (migrate its ranks away, checkpoint, or ignore).

After a checkpoint the rank's newest image stays in staging, up to
--keep-images in all: a restore of that checkpoint on this node (a job
restarted where its ranks were) then reads nothing from the store.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if creds == "" {
				return usageError{errors.New("--creds DIR is required")}
			}
			c, err := pki.LoadCredentials(creds)
			if err != nil {
				return err
			}
			if c.Role != pki.Agent {
				return fmt.Errorf("credentials in %s are for a %s, not an agent", creds, c.Role)
			}
			node := agent.Node{NetnsPrefix: netnsPrefix}
			if coordAddr != "" {
				if underlay == "" {
					return usageError{errors.New("--underlay IP is required with --coordinator")}
				}
				if node.Underlay, err = netip.ParseAddr(underlay); err != nil {
					return usageError{fmt.Errorf("--underlay: %w", err)}
				}
			}
			if node.NetnsPrefix == "" {
				node.NetnsPrefix = "cairn-" + c.Name + "-"
			}
			lbl := map[string]string{}
			for _, kv := range labels {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return usageError{fmt.Errorf("--label %q: want KEY=VALUE", kv)}
				}
				lbl[k] = v
			}
			// The node's credentials are never a rank's to read.
			global.hide = append(global.hide, creds)
			global.keepImages = keepImages
			m, err := manager()
			if err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			tools, err := launch.InstallTools(toolsDir, exe, mpichFix)
			if err != nil {
				return fmt.Errorf("install the tools of MPI ranks in %s: %w", toolsDir, err)
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			unlockRanks(cmd.Context(), m, log)
			log.Info("agent serving", "node", c.Name, "addr", ln.Addr().String(), "cluster", c.ClusterID)
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			if coordAddr != "" {
				if advertise == "" {
					advertise = ln.Addr().String()
				}
				j := coordv1.Join{Name: c.Name, Addr: advertise, Underlay: underlay, Labels: lbl}
				h := agent.NewHealth(agent.HealthConfig{Every: healthEvery, DataDir: global.dataDir, MinFreeDisk: minDisk / 100,
					MinFreeMemory: minMem / 100, Command: healthCmd, Node: c.Name})
				go h.Run(ctx, func(w []string) {
					if len(w) > 0 {
						log.Warn("health probes failing", "probes", strings.Join(w, "; "))
					} else {
						log.Info("health probes pass")
					}
				})
				// The store's quarantine, reported with every heartbeat:
				// the coordinator publishes each new damaged pack.
				quarantined := func() []string {
					qs, err := m.Repo().Quarantined()
					if err != nil {
						return []string{"cannot read the store's quarantine: " + err.Error()}
					}
					var out []string
					for _, q := range qs {
						out = append(out, q.String())
					}
					return out
				}
				go keepJoined(ctx, rpc.NewCoordClient(coordAddr, c), j, h.Warnings, quarantined, log)
			}
			return (&agent.Server{Manager: m, Creds: c, Logger: log, Node: node, Tools: tools}).Serve(ctx, ln)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:7420", "address to serve on")
	f.StringVar(&creds, "creds", "", "directory with the node's credentials (required)")
	f.StringVar(&coordAddr, "coordinator", os.Getenv("CAIRN_COORDINATOR"), "join the cluster of the coordinator at ADDR ($CAIRN_COORDINATOR)")
	f.StringVar(&underlay, "underlay", "", "this node's address between nodes (required with --coordinator)")
	f.StringVar(&advertise, "advertise", "", "agent API address the coordinator calls (default: --listen)")
	f.StringVar(&healthCmd, "health-cmd", "", "health probe: a shell command (CAIRN_NODE set) that fails when the node is unwell")
	f.DurationVar(&healthEvery, "health-every", 5*time.Second, "how often the health probes run")
	f.Float64Var(&minDisk, "health-min-free-disk", 5, "health probe: percent of the data dir's disk that must stay free (0: off)")
	f.Float64Var(&minMem, "health-min-free-memory", 5, "health probe: percent of memory that must stay available (0: off)")
	f.StringVar(&netnsPrefix, "netns-prefix", "", "name prefix of rank network namespaces (default cairn-NODE-)")
	f.StringArrayVar(&labels, "label", nil, "node label KEY=VALUE, e.g. rack=r1 (repeatable)")
	f.StringVar(&keepImages, "keep-images", envOr("CAIRN_KEEP_IMAGES", "1G"), "staging the node may use to keep each rank's newest image after its checkpoint, so that a restore of it here reads no store; 0 keeps none ($CAIRN_KEEP_IMAGES)")
	f.StringVar(&toolsDir, "tools-dir", filepath.Join(prefix(), "tools"), "where the tools mounted in MPI ranks (this cairn binary, the MPICH fix) are kept, by content")
	f.StringVar(&mpichFix, "mpich-fix", filepath.Join(prefix(), "lib", launch.MPICHFix), "the library preloaded into MPICH processes (built by make setup; see docs/mpi.md)")
	return cmd
}

// unlockRanks unlocks the network of every rank on this node: an agent
// that died in the middle of a round may have left some locked, and a new
// agent holds no round.
func unlockRanks(ctx context.Context, m *container.Manager, log *slog.Logger) {
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

// keepJoined joins the cluster and sends heartbeats until ctx ends; it
// joins again whenever the coordinator no longer knows the node.
func keepJoined(ctx context.Context, cl *rpc.CoordClient, j coordv1.Join, health, quarantined func() []string, log *slog.Logger) {
	defer cl.Close()
	every := time.Second
	joined := false
	for {
		var err error
		if !joined {
			var reply coordv1.JoinReply
			reply, err = cl.Join(ctx, j)
			if err == nil {
				joined = true
				if reply.Heartbeat > 0 {
					every = reply.Heartbeat
				}
				log.Info("joined the cluster", "node", j.Name, "heartbeat", every)
			}
		} else {
			hctx, cancel := context.WithTimeout(ctx, every*2)
			err = cl.Heartbeat(hctx, coordv1.Heartbeat{Name: j.Name, Health: health(), Quarantined: quarantined()})
			cancel()
			var we *agentv1.Error
			if errors.As(err, &we) && we.Code == agentv1.CodeNotFound {
				joined = false
				continue
			}
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("coordinator", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
