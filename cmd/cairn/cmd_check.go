package main

import (
	"fmt"
	"os/exec"
	"strings"

	"github.com/spf13/cobra"

	"cairn/internal/criu"
	"cairn/internal/stateapp"
)

func newCheckCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check that this node can run and checkpoint containers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			type item struct {
				Name   string `json:"name"`
				OK     bool   `json:"ok"`
				Detail string `json:"detail"`
			}
			var items []item
			add := func(name string, err error, detail string) {
				it := item{Name: name, OK: err == nil, Detail: detail}
				if err != nil {
					it.Detail = err.Error()
				}
				items = append(items, it)
			}
			path, err := criu.Find(global.criuPath)
			if err == nil {
				var info criu.Info
				info, err = criu.Check(cmd.Context(), path)
				add("criu", err, fmt.Sprintf("%s at %s, `criu check` passed", info.Version, path))
			} else {
				add("criu", err, "")
			}
			out, err := exec.CommandContext(cmd.Context(), global.runcPath, "--version").Output()
			add("runc", err, strings.SplitN(string(out), "\n", 2)[0])
			for _, tool := range []string{"ip", "iptables"} {
				p, err := exec.LookPath(tool)
				add(tool, err, p)
			}
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
				for _, it := range items {
					mark := "ok "
					if !it.OK {
						mark = "BAD"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s %-9s %s\n", mark, it.Name, it.Detail)
				}
			}
			if bad > 0 {
				return fmt.Errorf("%d of %d checks failed; run `make setup`", bad, len(items))
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
