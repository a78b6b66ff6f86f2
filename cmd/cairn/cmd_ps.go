package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"cairn/internal/container"
	"cairn/internal/human"
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
			if asJSON {
				return printJSONList(cmd.OutOrStdout(), list)
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "NAME\tSTATUS\tPID\tADDRESS\tCREATED\tCOMMAND")
			for _, in := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", in.Name, statusText(in), pidText(in.Pid), in.Addr,
					human.Ago(in.Created), truncate(strings.Join(in.Config.Args, " "), 40))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&job, "job", "", "list the ranks of this job of the cluster")
	return cmd
}

func statusText(in *container.Info) string {
	if in.Status == "exited" && in.Exit != nil {
		if in.Exit.Signal != "" {
			return fmt.Sprintf("exited (%s)", in.Exit.Signal)
		}
		return fmt.Sprintf("exited (%d)", in.Exit.Code)
	}
	if in.RestoredFrom != "" && in.Status == "running" {
		return "running (restored " + in.RestoredFrom + ")"
	}
	return in.Status
}

func pidText(pid int) string {
	if pid == 0 {
		return "-"
	}
	return fmt.Sprint(pid)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
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
			w := newTable(cmd.OutOrStdout())
			row := func(k string, v any) { fmt.Fprintf(w, "%s:\t%v\n", k, v) }
			row("Name", in.Name)
			row("Status", statusText(in))
			row("PID", pidText(in.Pid))
			row("Command", strings.Join(in.Config.Args, " "))
			row("Address", in.Addr)
			row("Netns", in.Endpoint.Path())
			row("Veth", in.Endpoint.Veth)
			lower := in.Config.RootFS
			if lower == "" {
				lower = "/ (host)"
			}
			row("Lower layer", lower)
			row("Root", in.RootFS)
			row("Log", in.Log)
			row("Cgroup", in.CgroupsPath)
			row("Created", in.Created.Local().Format("2006-01-02 15:04:05"))
			if in.RestoredFrom != "" {
				row("Restored from", in.RestoredFrom)
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
