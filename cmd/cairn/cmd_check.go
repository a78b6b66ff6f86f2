package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/rankclient"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/stateapp"
	"github.com/cairn-hpc/cairn/internal/table"
)

func newCheckCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check that this node can run and checkpoint containers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			items := container.CheckHost(cmd.Context(), global.criuPath, global.runcPath)
			bad := 0
			for _, it := range items {
				if !it.OK {
					bad++
				}
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), items); err != nil {
					return err
				}
			} else {
				table.Checks(cmd.OutOrStdout(), items)
			}
			if bad > 0 {
				return fmt.Errorf("%d of %d checks failed (BAD above); `make setup` in cairn's source, or /usr/share/cairn/install-criu where it came from its package, installs CRIU", bad, len(items))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newStateappCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "stateapp [FLAGS]",
		Short:              "A stateful test program (counter, file, TCP stream) for demos and tests",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := stateapp.Main(args); code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
}

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

func newRankCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "rank info|checkpoint|stop|event KIND MESSAGE [--json] [--job JOB]",
		Short:              "Inside a rank: where it stands, a checkpoint of its job (or a stop), an event",
		Long:               rankclient.Usage,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return rankclient.Main(cmd.Context(), args, cmd.OutOrStdout())
		},
	}
}
