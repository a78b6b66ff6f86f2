package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/table"
)

func newMigrateCmd() *cobra.Command {
	var to string
	var asJSON, postCopy bool
	cmd := &cobra.Command{
		Use:   "migrate JOB/RANK [--to NODE] [--post-copy]",
		Short: "Move one rank of a running job to another node while the rest of the job waits",
		Long: `Move one rank to another node without a checkpoint of the whole job:
(1) every rank of the job is frozen with its network locked and the moving
rank is dumped into memory on its node; (2) its image streams to the target
node; (3) the target restores the rank from memory with the same address;
(4) every rank resumes. If anything fails before the rank runs on the
target, the job resumes where it was and the error says what failed.

With --post-copy the rank moves without its memory: it runs on the target
as soon as it is restored there, and its pages follow from the source as
it touches them and in the background, so the job waits for the dump and
the rank's files but not for its memory to cross. The source keeps the
pages in memory until the last one has arrived. If the source node or its
agent fails before then, the rank cannot go on: it is killed, and the job
restarts from its newest checkpoint.

Without --to the rank goes to a spare node first, else to the least loaded
node. The migration's phases are in 'cairn events --job JOB' and its
record in 'cairn migrations JOB'.`,
		Example: `  cairn migrate sim/3 --to cl-n4
  cairn migrate sim/3 --to cl-n4 --post-copy
  cairn migrate sim/0`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			job, rank, err := names.ParseRank(args[0])
			if err != nil {
				return err
			}
			return withCoord(func(c *rpc.CoordClient) error {
				m, err := c.Migrate(cmd.Context(), job, coordv1.Migrate{Rank: rank, To: to, PostCopy: postCopy})
				if err != nil {
					return goesOn(cmd.Context(), err, "migration of "+args[0], "`"+cairnCmd()+" migrations "+job+"`")
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), m)
				}
				table.Migration(cmd.OutOrStdout(), m)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "node to move the rank to (default: a spare, else the least loaded node)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the migration record as JSON")
	cmd.Flags().BoolVar(&postCopy, "post-copy", false, "move the rank's memory after it runs on the target (the job waits less; a source failure meanwhile restarts the job)")
	return cmd
}

func newMigrationsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "migrations JOB",
		Short: "List a job's rank migrations",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCoord(func(c *rpc.CoordClient) error {
				ms, err := c.Migrations(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printList(cmd.OutOrStdout(), asJSON, ms, table.Migrations)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newDrainCmd() *cobra.Command {
	var asJSON, postCopy bool
	cmd := &cobra.Command{
		Use:   "drain NODE [--post-copy]",
		Short: "Move every rank off a node (spares first) and keep new ranks away from it",
		Long: `Migrate every rank on NODE to other nodes, spares first (see 'cairn
migrate'), and mark the node drained: no job, restart or migration places a
rank there until 'cairn node undrain NODE'. Use it before servicing a node.

With --post-copy each rank moves post-copy (see 'cairn migrate'): its job
waits less, but the node must stay up until every moved rank's memory has
left it; its agent logs "the target has every page" for each rank.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return drain(cmd, args[0], coordv1.Drain{PostCopy: postCopy}, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the node and its migrations as JSON")
	cmd.Flags().BoolVar(&postCopy, "post-copy", false, "migrate each rank post-copy (see cairn migrate --post-copy)")
	return cmd
}

func newNodeUndrainCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "undrain NODE",
		Short: "Let ranks be placed on a drained node again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return drain(cmd, args[0], coordv1.Drain{Undrain: true}, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func drain(cmd *cobra.Command, node string, req coordv1.Drain, asJSON bool) error {
	undrain := req.Undrain
	return withCoord(func(c *rpc.CoordClient) error {
		res, err := c.Drain(cmd.Context(), node, req)
		if asJSON && (err == nil || res.Node.Name != "") {
			if res.Migrations == nil {
				res.Migrations = []coordv1.Migration{}
			}
			if perr := printJSON(cmd.OutOrStdout(), res); perr != nil {
				return errors.Join(err, perr)
			}
			return err
		}
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		if undrain {
			fmt.Fprintf(out, "node %s takes ranks again\n", node)
			return nil
		}
		for _, m := range res.Migrations {
			table.Migration(out, m)
		}
		fmt.Fprintf(out, "node %s is drained: %s moved away\n", node, human.Plural(len(res.Migrations), "rank"))
		return nil
	})
}
