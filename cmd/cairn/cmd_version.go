package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// versionInfo is what `cairn version` prints.
type versionInfo struct {
	Version  string `json:"version"`            // the module version, or "devel"
	Revision string `json:"revision,omitempty"` // the VCS revision built from
	Modified bool   `json:"modified,omitempty"` // built from a tree with changes
	Go       string `json:"go"`
	API      string `json:"api"` // the agent and coordinator API version
}

// buildRevision is set by the Makefile (-ldflags -X) for builds without
// VCS stamping.
var buildRevision string

func buildVersion() versionInfo {
	v := versionInfo{Version: "devel", Revision: buildRevision, Go: runtime.Version(), API: "v1"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (v versionInfo) String() string {
	s := "cairn " + v.Version
	if v.Revision != "" {
		s += " (" + v.Revision
		if len(v.Revision) > 12 {
			s = s[:len(s)-len(v.Revision)+12]
		}
		if v.Modified {
			s += ", modified"
		}
		s += ")"
	}
	return s + ", " + v.Go + ", API " + v.API
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print cairn's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := buildVersion()
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
