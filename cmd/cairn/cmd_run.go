package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/launch"
	"github.com/cairn-hpc/cairn/internal/table"
)

// runGrace is how long run watches a program it started before it says
// the program runs.
const runGrace = 250 * time.Millisecond

func newRunCmd() *cobra.Command {
	var cfg container.Config
	var asJSON bool
	var job coordv1.RunJob
	var replRate, memory, export, every string
	var volumes []string
	cmd := &cobra.Command{
		Use:   "run (--name NAME | --job NAME --ranks N) [--rootfs DIR] [--env K=V]... -- CMD [ARGS...]",
		Short: "Start a command in a new container, or a job of N ranks on the cluster",
		Long: `Start CMD in a new container named NAME: an overlay root (the host's / unless
--rootfs gives another lower layer), its own pid, mount, uts, ipc and network
namespaces, a cgroup, and an address on the node bridge. The container runs in
the background; its output goes to its log (cairn logs NAME).

With --job, start a job on the cluster instead: N rank containers placed on
its nodes (at most --per-node on each, only on --nodes if given), each with
CAIRN_RANK, CAIRN_SIZE, CAIRN_JOB, CAIRN_SUBNET (the job's network) and
CAIRN_PEERS (the IPs of all ranks in rank order; not given to jobs of more
than about 4,000 ranks: rank R's IP is then CAIRN_SUBNET's third plus R) in
its environment. Each job has its own subnet, and a rank keeps
its IP wherever it runs. --checkpoint-every takes a global checkpoint at that
interval; auto chooses it by Daly's formula from the job's measured checkpoint
cost and --mtbf, again after every round ('cairn report JOB' says why). After
each checkpoint, every rank image is copied to --replicas other nodes; when a
node of the job dies, the job restarts by itself from the newest
checkpoint complete on live nodes, onto spares first (--on-failure restart).
With --mpi, CMD is an MPI program run as N processes, one per rank
(docs/mpi.md). Ranks talk to cairn through the rank API ($CAIRN_SOCKET,
docs/rank-api.md); with --mode app they save their own state when told and
start afresh on it at a restart, never dumped by CRIU. As srun does, a job's ranks get the caller's environment
(--export ALL, less what belongs to the caller's session: SSH_*, DISPLAY,
XDG_*, CAIRN_*...; --export NONE or --export VAR,VAR) plus --env, and start
in the caller's working directory (or --workdir).

--volume HOST:PATH[:ro] binds a host directory into the container or every
rank (for a job, the same path on every node: a shared file system). A
volume is outside the checkpoints: a restore does not roll it back. --cpus
and --memory limit each container, and --pids-limit (4096 by default) its
processes and threads together: a fork bomb fails inside it.

--export ALL gives every rank the caller's whole environment, secrets in it
included (tokens, passwords in variables), and it is kept in the job's
record and in every checkpoint of its ranks. Name what the job needs
(--export VAR,VAR, or NONE with --env) when the environment holds secrets.`,
		Example: `  cairn run --name sim -- /usr/bin/python3 -c 'import time; time.sleep(1e9)'
  cairn run --name sim --env OMP_NUM_THREADS=2 --rootfs /srv/rootfs -- ./solver
  cairn run --job ring --ranks 4 --checkpoint-every 5m -- /usr/bin/ring-solver`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cfg.PidsLimit == 0 || cfg.PidsLimit < -1 {
				return usageError{fmt.Errorf("--pids-limit %d: want a number of processes, or -1 for no limit", cfg.PidsLimit)}
			}
			if job.Name != "" {
				if cfg.Name != "" {
					return usageError{fmt.Errorf("--name and --job exclude each other")}
				}
				if err := notWith(cmd, "a job (--job)", "hostname", "userns"); err != nil {
					return err
				}
				if len(args) == 0 {
					return usageError{fmt.Errorf("no command given: cairn run --job NAME --ranks N -- CMD [ARGS...]")}
				}
				env, err := launch.ExportEnv(export, os.Environ())
				if err != nil {
					return usageError{fmt.Errorf("--export %w", err)}
				}
				job.Args, job.Env, job.RootFS = args, append(env, cfg.Env...), cfg.RootFS
				job.Cwd = cfg.Cwd
				if job.Cwd == "" {
					job.Cwd, _ = os.Getwd()
				}
				job.Volumes, job.CPUs, job.PidsLimit = volumes, cfg.CPUs, cfg.PidsLimit
				if _, err := container.ParseVolumes(volumes); err != nil {
					return usageError{err}
				}
				if memory != "" {
					if job.Memory, err = human.ParseBytes(memory); err != nil {
						return usageError{fmt.Errorf("--memory: %w", err)}
					}
				}
				if job.MPI != "" {
					if err := launch.CheckKind(job.MPI); err != nil {
						return usageError{fmt.Errorf("--mpi: %w", err)}
					}
				}
				if every == "auto" {
					job.CheckpointAuto = true
				} else if every != "" {
					if job.CheckpointEvery, err = time.ParseDuration(every); err != nil {
						return usageError{fmt.Errorf("--checkpoint-every %q: want a duration or auto", every)}
					}
				}
				if replRate != "" {
					r, err := human.ParseBytes(replRate)
					if err != nil {
						return usageError{fmt.Errorf("--replication-rate: %w", err)}
					}
					job.ReplicationRate = r
				}
				return runJob(cmd, job, asJSON)
			}
			if cfg.Name == "" {
				return usageError{fmt.Errorf("--name (a container) or --job (a job on the cluster) is required")}
			}
			if err := notWith(cmd, "a container (--name)", jobFlags...); err != nil {
				return err
			}
			var err error
			if cfg.Volumes, err = container.ParseVolumes(volumes); err != nil {
				return usageError{err}
			}
			if memory != "" {
				if cfg.Memory, err = human.ParseBytes(memory); err != nil {
					return usageError{fmt.Errorf("--memory: %w", err)}
				}
			}
			if len(args) == 0 {
				return usageError{fmt.Errorf("no command given: cairn run --name NAME -- CMD [ARGS...]")}
			}
			for _, kv := range cfg.Env {
				if !strings.Contains(kv, "=") {
					return usageError{fmt.Errorf("--env %q: want KEY=VALUE", kv)}
				}
			}
			cfg.Args = args
			if cfg.Cwd == "" && cfg.RootFS == "" {
				// The host's / is the container's lower layer: start where
				// the caller is, so that `run -- ./prog` finds ./prog, as a
				// job's ranks do.
				cfg.Cwd, _ = os.Getwd()
			}
			m, err := manager()
			if err != nil {
				return err
			}
			in, err := m.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			// A program that fails at once (a missing file, a bad
			// argument) has done so within a moment: say so, not that
			// it runs. One that ended already has its exit recorded
			// within seconds.
			wait := runGrace
			if in.Status != container.StatusRunning || in.Pid == 0 {
				wait = 5 * time.Second
			}
			wctx, cancel := context.WithTimeout(cmd.Context(), wait)
			if w, err := m.Wait(wctx, in.Name); err == nil {
				in = w
			}
			cancel()
			if asJSON {
				return printJSON(cmd.OutOrStdout(), in)
			}
			if in.Status == container.StatusExited && in.Exit != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s at once; its output: %s logs %s\n", in.Name, table.Status(in), cairnCmd(), in.Name)
				if in.Exit.Code != 0 {
					return fmt.Errorf("%s exited at once with code %d", in.Name, in.Exit.Code)
				}
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s running (pid %d, address %s)\n", in.Name, in.Pid, in.Addr)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Name, "name", "", "container name (required)")
	f.StringVar(&cfg.RootFS, "rootfs", "", "lower layer of the container's root (default: the host's /)")
	f.StringArrayVarP(&cfg.Env, "env", "e", nil, "set an environment variable KEY=VALUE (repeatable)")
	f.StringVar(&cfg.Hostname, "hostname", "", "hostname inside the container (default: its name)")
	f.StringVarP(&cfg.Cwd, "workdir", "w", "", "working directory inside the container (default: the current directory, or / with --rootfs)")
	f.StringArrayVarP(&volumes, "volume", "v", nil, "bind a host directory: HOST:PATH or HOST:PATH:ro (repeatable; outside the checkpoints)")
	f.Float64Var(&cfg.CPUs, "cpus", 0, "limit the container (each rank) to this many CPUs' time")
	f.StringVar(&memory, "memory", "", "limit the container's (each rank's) memory, e.g. 4G")
	f.Int64Var(&cfg.PidsLimit, "pids-limit", container.DefaultPidsLimit, "limit the container's (each rank's) processes and threads together; -1: no limit")
	f.StringVar(&export, "export", "ALL", "a job's environment from the caller: ALL (less the caller's session's), NONE, or VAR,VAR")
	f.BoolVar(&cfg.UserNS, "userns", false, "run the container in a user namespace of its own: its root is host uid 1000000 and has no power over the host's files (see docs/security.md for what it costs)")
	f.BoolVar(&asJSON, "json", false, "print the container (or job) as JSON")
	f.StringVar(&job.Name, "job", "", "start a job of this name on the cluster")
	f.StringVar(&job.MPI, "mpi", "", "run CMD as an MPI program of --ranks processes, one per rank: openmpi or mpich (docs/mpi.md)")
	f.StringVar(&job.Mode, "mode", "transparent", "how ranks are checkpointed: transparent (CRIU) or app (each rank saves its own state when told, through the rank API; docs/rank-api.md)")
	f.IntVar(&job.Ranks, "ranks", 1, "number of ranks of the job")
	f.IntVar(&job.PerNode, "per-node", 0, "at most this many ranks per node (default: spread evenly)")
	f.StringSliceVar(&job.Nodes, "nodes", nil, "place the job's ranks on these nodes only")
	f.StringVar(&every, "checkpoint-every", "", "take a global checkpoint of the job at this interval, or auto: at the interval that minimizes lost work plus overhead for the job's measured checkpoint cost and MTBF")
	f.DurationVar(&job.MTBF, "mtbf", 0, "with --checkpoint-every auto: the mean time between failures of one of the job's nodes (default: the cluster's)")
	f.IntVar(&job.Replicas, "replicas", 1, "copies of every rank image on other nodes, made after each checkpoint")
	f.StringVar(&job.OnHealthWarning, "on-health-warning", coordv1.HealthIgnore, "when a health probe of a node of the job goes bad: migrate (its ranks there to other nodes, spares first), checkpoint, or ignore")
	f.StringVar(&job.OnFailure, "on-failure", coordv1.OnFailureRestart, "when a node of the job dies: restart (from the newest restorable checkpoint) or stop")
	f.IntVar(&job.MaxRestarts, "max-restarts", 10, "automatic restarts allowed (0: no limit)")
	f.StringVar(&job.Tier, "tier", "", "durable tier the job's checkpoints are flushed to: s3://BUCKET[/PREFIX] or file:///DIR (cairn flush; docs/hpc.md)")
	f.IntVar(&job.FlushEvery, "flush-every", 0, "flush every Nth checkpoint to --tier once it is protected (0: only cairn flush)")
	f.IntVar(&job.Keep, "keep", 0, "keep the newest N protected checkpoints (plus pinned ones), removing older ones from the catalog and every node (0: keep all)")
	f.StringVar(&replRate, "replication-rate", "", "limit each replica transfer to this many bytes/s, e.g. 50M (default: no limit)")
	f.BoolVar(&job.KillOnBadExit, "kill-on-bad-exit", false, "end the job as soon as one of its ranks ends other than by exiting 0: its other ranks are killed and the job is failed (as srun --kill-on-bad-exit)")
	f.BoolVar(&job.LazyRestore, "lazy-restore", false, "on restarts, restore a rank whose node lacks its image lazily: it runs before all of its memory has arrived (docs/lazy.md)")
	return cmd
}

// jobFlags are run's flags that only a job takes.
var jobFlags = []string{"mpi", "mode", "export", "ranks", "per-node", "nodes", "checkpoint-every", "mtbf", "replicas", "on-health-warning", "on-failure", "max-restarts", "replication-rate", "lazy-restore", "kill-on-bad-exit", "keep", "tier", "flush-every"}

// notWith refuses (usage error) any of the given flags that was set: they
// do not apply to what cmd was asked to do.
func notWith(cmd *cobra.Command, what string, flags ...string) error {
	var set []string
	for _, f := range flags {
		if cmd.Flags().Changed(f) {
			set = append(set, "--"+f)
		}
	}
	if len(set) == 0 {
		return nil
	}
	return usageError{fmt.Errorf("%s does not apply to %s", strings.Join(set, ", "), what)}
}
