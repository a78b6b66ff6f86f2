package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/chaos"
)

func newChaosCmd() *cobra.Command {
	var cfg chaos.Config
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "chaos [--mtbf D] [--repair D] [--duration D] [--seed N] [--ranks N] [--messages N] [--replicas K] [--lose-data] [--json]",
		Short: "Local clusters only: fail nodes at random under a job and measure its ETTR against the model's",
		Long: `Run the ring job (cairn ringapp) on the local cluster made by 'cairn up',
one rank a node, with --checkpoint-every auto and --replicas copies, so that
it restarts by itself when a node of its dies. From its first protected
checkpoint on, every node of the cluster fails at random, as a machine that
stops (its agent and containers killed; with --lose-data its disk too), at
exponential times of mean --mtbf (a node's MTBF, seeded by --seed: the same
seed fails the same nodes at the same times), and comes back --repair later,
once the coordinator has found it dead, as 'cairn node revive' brings it
back: booted afresh, its disk as the failure left it. Failures
go on for --duration, or until the job ends. At the end every node is back,
even when the run is stopped (Ctrl-C) or fails, and the job is removed
(--keep keeps it).

Then it prints the job's effective training time ratio (ETTR): the useful
time (the work the job kept over the run, at the rate it runs without
failures or checkpoints, measured in the same run) over the wall time; the
model's ETTR for the checkpoint cost C, the restart time R, the job's MTBF M
and the interval measured in the same run (docs/planning.md, "ETTR under
failures"); the failures, restarts and where the time went; and whether the
job's result is exactly what ringapp.Expected computes. The job's result
being wrong is an error. The cluster needs a node more than --ranks.`,
		Example: `  cairn up --nodes 5
  cairn chaos --ranks 2 --mtbf 120s --repair 30s --messages 30000000
  cairn chaos --duration 5m --seed 7 --json > chaos.json
  cairn down`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if coordFlags.addr != "" {
				return usageError{errors.New("chaos fails nodes of the local cluster of 'cairn up' only, not of --coordinator's")}
			}
			cfg.CLI = cairnCmd()
			if err := cfg.Check(); err != nil {
				return err
			}
			lc, err := localCluster()
			if errors.Is(err, errNoCluster) {
				return fmt.Errorf("no local cluster: start one with `%s up --nodes N` (a node more than the job's ranks)", cairnCmd())
			}
			if err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cl, err := coordClient()
			if err != nil {
				return err
			}
			defer cl.Close()
			out := cmd.OutOrStdout()
			if asJSON {
				out = cmd.ErrOrStderr() // stdout is the result's
			}
			env := chaos.Env{Cluster: lc, Runtime: nodeRuntime(), Coord: cl, Exe: exe, Out: out}
			res, err := chaos.Run(cmd.Context(), env, cfg)
			if res != nil {
				if asJSON {
					if perr := printJSON(cmd.OutOrStdout(), res); perr != nil {
						return perr
					}
				} else {
					fmt.Fprintln(cmd.OutOrStdout())
					if perr := res.WriteText(cmd.OutOrStdout()); perr != nil {
						return perr
					}
				}
			}
			if err != nil {
				return err
			}
			if !res.Exact {
				return fmt.Errorf("job %s's result %q is not the %s ringapp.Expected computes", res.Job, res.Output, res.Expected)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Job, "job", chaos.DefaultJob, "name of the job the run starts (and removes)")
	f.IntVar(&cfg.Ranks, "ranks", chaos.DefaultRanks, "ranks of the ring job, one a node")
	f.IntVar(&cfg.Messages, "messages", chaos.DefaultMessages, "messages each rank of the ring job handles (its length)")
	f.IntVar(&cfg.Replicas, "replicas", 1, "copies of every rank image on other nodes (at least 1: the job restarts from them)")
	f.DurationVar(&cfg.MTBF, "mtbf", chaos.DefaultMTBF, "a node's mean time between failures (the job's is this over --ranks)")
	f.DurationVar(&cfg.Repair, "repair", chaos.DefaultRepair, "how long a failed node stays down")
	f.DurationVar(&cfg.Duration, "duration", 0, "stop failing nodes after this long, then let the job finish (0: fail them until the job ends)")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the failures: the same seed, the same failures")
	f.BoolVar(&cfg.LoseData, "lose-data", false, "a failed node loses its disk too (its data dir and staging)")
	f.BoolVar(&cfg.Keep, "keep", false, "keep the job on the cluster afterwards")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON (the progress goes to stderr)")
	return cmd
}
