package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/version"
)

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print cairn's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := version.Get()
			if asJSON {
				return printJSON(cmd.OutOrStdout(), v)
			}
			fmt.Fprintln(cmd.OutOrStdout(), v)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
