package main

import (
	"errors"
	"math/rand/v2"
	"time"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/plan"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/table"
)

func newPlanCmd() *cobra.Command {
	var n, k, f, trials int
	var placement string
	var target float64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "plan --nodes N [--replicas K] [--failures F] [--placement random|ring|pairs] [--target P]",
		Short: "How likely a job can restart after node failures, for a replica count and placement",
		Long: `Compute, exactly, the probability that a job using all N nodes can restart
after F simultaneous random node failures when every node's checkpoint images
have K replicas on other nodes, and how many failures it survives with 90%,
99% and 99.9% probability. With --target P and --failures F, say the
smallest K that reaches P. --monte-carlo TRIALS adds a simulation with its
99.9% confidence interval as a cross-check. Without --placement, all three
placements are compared.`,
		Example: `  cairn plan --nodes 4096 --replicas 2 --failures 32
  cairn plan --nodes 1024 --failures 16 --target 0.999
  cairn plan --nodes 64 --replicas 1 --placement pairs --failures 4 --monte-carlo 100000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 {
				return usageError{errors.New("--nodes N is required")}
			}
			places := []plan.Placement{plan.Random, plan.Ring, plan.Pairs}
			if placement != "" {
				p, err := plan.ParsePlacement(placement)
				if err != nil {
					return usageError{err}
				}
				places = []plan.Placement{p}
			}
			q := plan.Query{Nodes: n, Replicas: k, Target: target, Trials: trials, Rand: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))}
			if cmd.Flags().Changed("failures") {
				q.Failures = &f
			}
			rows, err := plan.Answer(q, places)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), rows)
			}
			return table.Plan(cmd.OutOrStdout(), q, rows)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&n, "nodes", 0, "number of nodes the job uses (required)")
	fl.IntVar(&k, "replicas", 1, "replicas of every node's images on other nodes")
	fl.IntVar(&f, "failures", 0, "simultaneous random node failures")
	fl.StringVar(&placement, "placement", "", "random, ring or pairs (default: compare all three)")
	fl.Float64Var(&target, "target", 0, "with --failures: find the smallest --replicas reaching this probability")
	fl.IntVar(&trials, "monte-carlo", 0, "also estimate by simulation with this many trials")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newReportCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "report JOB [--json]",
		Short: "A job's overhead so far: the terms of its run time, replication, checkpoint interval, restart odds",
		Long: `Show the measured terms of the job's run time, per checkpoint and summed,
against the run time measured, its overhead, replication, checkpoint interval
(if automatic, why) and the probability that it can restart after 1-3
simultaneous node failures, by cairn plan's reckoning (docs/planning.md).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCoord(func(c *rpc.CoordClient) error {
				r, err := c.Report(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), r)
				}
				return table.Report(cmd.OutOrStdout(), r)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
