package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/template"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/table"
)

func newPsCmd() *cobra.Command {
	var asJSON, quiet bool
	var job, format string
	cmd := &cobra.Command{
		Use:     "ps",
		Aliases: []string{"list", "ls"},
		Short:   "List containers (of this node, or the ranks of a job with --job)",
		Long: `List this node's containers, or with --job the ranks of a job of the
cluster: a table, --json, -q (names only, one a line), or --format TEMPLATE
(a Go template applied to each, one a line; the fields are --json's, by
their Go names: '{{.Name}} {{.Status}} {{.Pid}}' for a container,
'{{.Rank}} {{.Node}} {{.Status}}' for a rank).`,
		Example: `  cairn ps
  cairn ps -q | xargs -n1 cairn checkpoint
  cairn ps --format '{{.Name}}\t{{.Status}}\t{{.Addr}}'
  cairn ps --job ring --format '{{.Rank}} {{.Node}}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n := countTrue(asJSON, quiet, format != ""); n > 1 {
				return usageError{errors.New("--json, -q and --format exclude each other")}
			}
			var tmpl *template.Template
			if format != "" {
				var err error
				if tmpl, err = template.New("format").Parse(unescapeFormat(format)); err != nil {
					return usageError{fmt.Errorf("--format: %w", err)}
				}
			}
			if job != "" {
				return jobPs(cmd, job, asJSON, quiet, tmpl)
			}
			m, err := manager()
			if err != nil {
				return err
			}
			list, err := m.List(cmd.Context())
			if err != nil {
				return err
			}
			switch {
			case quiet:
				for _, in := range list {
					fmt.Fprintln(cmd.OutOrStdout(), in.Name)
				}
				return nil
			case tmpl != nil:
				return eachFormatted(cmd.OutOrStdout(), tmpl, list)
			}
			return printList(cmd.OutOrStdout(), asJSON, list, table.Containers)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the names (a job's: its ranks' container names)")
	cmd.Flags().StringVar(&format, "format", "", "print each with this Go template")
	cmd.Flags().StringVar(&job, "job", "", "list the ranks of this job of the cluster")
	return cmd
}

// countTrue counts the true ones of bs.
func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// unescapeFormat reads \t and \n in a --format as a tab and a newline, as
// podman does.
func unescapeFormat(s string) string { return strings.NewReplacer(`\t`, "\t", `\n`, "\n").Replace(s) }

// eachFormatted writes each of list with tmpl, a line each.
func eachFormatted[T any](w io.Writer, tmpl *template.Template, list []T) error {
	for _, v := range list {
		var b strings.Builder
		if err := tmpl.Execute(&b, v); err != nil {
			return usageError{fmt.Errorf("--format: %w", err)}
		}
		fmt.Fprintln(w, table.Printable(strings.TrimSuffix(b.String(), "\n")))
	}
	return nil
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
