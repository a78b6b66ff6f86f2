package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/cairn-hpc/cairn/internal/version"
)

// newManPagesCmd writes a man page for every command: what `make dist`
// puts in the package. Hidden: operators read the pages, not make them.
func newManPagesCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "man-pages DIR",
		Short:  "Write cairn's man pages (section 1) to DIR",
		Args:   cobra.ExactArgs(1),
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true
			header := &doc.GenManHeader{Title: "CAIRN", Section: "1", Source: "cairn " + version.Get().Version, Manual: "cairn manual"}
			if err := doc.GenManTree(root, header, args[0]); err != nil {
				return fmt.Errorf("man pages: %w", err)
			}
			return nil
		},
	}
}
