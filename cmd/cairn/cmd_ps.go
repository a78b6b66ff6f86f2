package main

import (
	"github.com/spf13/cobra"

	"cairn/internal/table"
)

func newPsCmd() *cobra.Command {
	var asJSON bool
	var job string
	cmd := &cobra.Command{
		Use:     "ps",
		Aliases: []string{"list", "ls"},
		Short:   "List containers (of this node, or the ranks of a job with --job)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if job != "" {
				return jobPs(cmd, job, asJSON)
			}
			m, err := manager()
			if err != nil {
				return err
			}
			list, err := m.List(cmd.Context())
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), asJSON, list, table.Containers)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&job, "job", "", "list the ranks of this job of the cluster")
	return cmd
}

func newInspectCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show everything cairn knows about a container",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			in, err := m.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), in)
			}
			return table.Container(cmd.OutOrStdout(), in)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
