package main

import (
	"github.com/spf13/cobra"

	"cairn/internal/ringapp"
)

func newRingappCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "ringapp [FLAGS]",
		Short:              "A communication-heavy test job: ranks pass checksummed messages around a TCP ring",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := ringapp.Main(args); code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
}
