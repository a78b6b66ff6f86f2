package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/demo"
)

func newDemoCmd() *cobra.Command {
	var keep bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show checkpoint, kill and restore of a stateful program",
		Long: `Run a stateful program in a container: a counter in memory, a file it appends
to, and a TCP stream of checksummed messages between two of its processes.
Checkpoint it, let it run on, kill it, change its files, restore it, and check
that memory, files and the TCP stream are exactly as at the checkpoint and that
the program goes on. Uses a data dir and bridge of its own and removes them
afterwards (unless --keep).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return demo.RunContainer(cmd.Context(), demo.Config{Out: cmd.OutOrStdout(), Color: isTerminal(os.Stdout), Keep: keep,
				Staging: global.stagingDir, CRIU: global.criuPath, Runc: global.runcPath})
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the demo's data dir and container for a look afterwards")
	cmd.AddCommand(newDemoClusterCmd())
	return cmd
}

func newDemoClusterCmd() *cobra.Command {
	var keep bool
	var messages int
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Show a cluster: a 4-rank job, global checkpoints, a restart on other nodes, a drain, a node failure",
		Long: `Start a local cluster of 3 nodes (cairn up), run a 4-rank job that passes
checksummed messages around a ring over TCP at full speed, take global
checkpoints while it runs, kill every rank, restart the job from the last
checkpoint with every rank on another node; drain a node, whose ranks migrate
while the job runs on; take one more checkpoint, which is
replicated to another node, and make a node fail with its disk: the job
restarts by itself on the spare from the replica. It must finish with exactly
the result of an uninterrupted run. Every step is a cairn command,
printed before it runs. Uses a data dir of its own and removes the cluster
afterwards (unless --keep).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return demo.RunCluster(cmd.Context(), demo.Config{Out: cmd.OutOrStdout(), Color: isTerminal(os.Stdout), Keep: keep, Messages: messages})
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "leave the cluster up afterwards (remove it with cairn --data DIR down)")
	cmd.Flags().IntVar(&messages, "messages", 1_500_000, "messages each rank of the ring handles")
	return cmd
}
