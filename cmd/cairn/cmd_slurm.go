package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/slurm"
)

func newSlurmCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "slurm",
		Short: "A cairn cluster inside a Slurm allocation (deploy/slurm, docs/hpc.md)",
		Long: `Bring a cairn cluster up inside a Slurm allocation, for the job script's
cairn commands, and take it down before the allocation ends. A job outlives
the allocation through its durable tier: deploy/slurm/cairn.sbatch stops it
at a checkpoint on Slurm's signal before the time limit, flushes it, and
requeues itself; the next allocation restarts it from the tier.`,
	}
	var dir, local string
	dirFlag := func(c *cobra.Command) {
		c.Flags().StringVar(&dir, "dir", "", "the allocation's directory, on a file system every node reads (default: $SLURM_SUBMIT_DIR/.cairn/$SLURM_JOB_ID)")
	}
	allocDir := func(cmd *cobra.Command) (slurm.Allocation, string, error) {
		a, err := slurm.Current(cmd.Context())
		if err != nil {
			return a, "", err
		}
		if dir == "" {
			return a, a.DefaultDir(), nil
		}
		return a, dir, nil
	}
	up := &cobra.Command{
		Use:   "up [--dir DIR] [--local DIR]",
		Short: "Start the coordinator here and an agent on every node of the allocation (srun); print the environment of the cluster's clients",
		Long: `Start a cairn cluster on the allocation's nodes: a new CA in DIR, the
coordinator on this node, and one agent on every node (one srun step), each
keeping its data in --local on its node. Once every agent has joined, print
the environment cairn's commands reach the cluster with, for eval:

  eval "$(cairn slurm up)"

The durable tier's credentials (AWS_*) must be in the environment of this
command: srun gives the agents the same.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			a, d, err := allocDir(cmd)
			if err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			addr, err := slurm.Up(cmd.Context(), a, slurm.Config{Exe: exe, Dir: d, Local: local})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "export CAIRN_COORDINATOR=%s\nexport CAIRN_CREDS=%s\n", addr, slurm.ClientCreds(d))
			fmt.Fprintf(cmd.ErrOrStderr(), "cairn cluster of allocation %s up: coordinator at %s, %d nodes\n", a.JobID, addr, len(a.Nodes))
			return nil
		},
	}
	dirFlag(up)
	up.Flags().StringVar(&local, "local", slurm.DefaultLocal(), "node-local directory for each node's data")
	down := &cobra.Command{
		Use:   "down [--dir DIR]",
		Short: "Stop the allocation's agents and coordinator (remove the job first: cairn rm -f JOB)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, d, err := allocDir(cmd)
			if err != nil {
				return err
			}
			return slurm.Down(d)
		},
	}
	dirFlag(down)
	var coordinator string
	agent := &cobra.Command{
		Use:    "agent --dir DIR --coordinator ADDR --local DIR",
		Short:  "Run this node's agent of the allocation's cluster (cairn slurm up starts it with srun)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" || coordinator == "" {
				return usageError{errors.New("--dir and --coordinator are required")}
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			return slurm.Agent(cmd.Context(), slurm.AgentConfig{Exe: exe, Dir: dir, Coordinator: coordinator, Local: local})
		},
	}
	agent.Flags().StringVar(&dir, "dir", "", "the allocation's directory")
	agent.Flags().StringVar(&coordinator, "coordinator", "", "the coordinator's address")
	agent.Flags().StringVar(&local, "local", slurm.DefaultLocal(), "node-local directory for the node's data")
	cmd.AddCommand(up, down, agent)
	return cmd
}
