package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestApplyEnv: a flag takes its variable's value unless the command line
// gave it; the variable does not count as given (a command the flag does
// not apply to must not refuse it); a repeatable flag takes shell-quoted
// words; a value the flag refuses names the variable.
func TestApplyEnv(t *testing.T) {
	cmd := &cobra.Command{Use: "x"}
	every := cmd.Flags().Duration("health-every", 0, "how often")
	listen := cmd.Flags().String("listen", "", "where")
	labels := cmd.Flags().StringArray("label", nil, "labels")
	own := cmd.Flags().String("coordinator", "", "its own ($CAIRN_COORDINATOR)")
	nameVars(cmd.Flags(), "CAIRN_X_")
	t.Setenv("CAIRN_X_HEALTH_EVERY", "7s")
	t.Setenv("CAIRN_X_LISTEN", "from-env")
	t.Setenv("CAIRN_X_LABEL", `rack=r1 "note=two words"`)
	t.Setenv("CAIRN_X_COORDINATOR", "ignored")
	if err := cmd.Flags().Parse([]string{"--listen", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(cmd.Flags()); err != nil {
		t.Fatal(err)
	}
	if *every != 7e9 || *listen != "from-flag" || !slices.Equal(*labels, []string{"rack=r1", "note=two words"}) || *own != "" {
		t.Errorf("health-every %v, listen %q, labels %q, coordinator %q", *every, *listen, *labels, *own)
	}
	if cmd.Flags().Changed("health-every") {
		t.Error("a flag set from its variable counts as given on the command line")
	}
	t.Setenv("CAIRN_X_HEALTH_EVERY", "soon")
	cmd2 := &cobra.Command{Use: "y"}
	cmd2.Flags().Duration("health-every", 0, "how often")
	nameVars(cmd2.Flags(), "CAIRN_X_")
	if err := applyEnv(cmd2.Flags()); err == nil || !strings.Contains(err.Error(), "$CAIRN_X_HEALTH_EVERY") {
		t.Errorf("a refused value: %v", err)
	}
	if got, err := splitWords(`a 'b c' "d \"e\"" ''`); err != nil || !slices.Equal(got, []string{"a", "b c", `d "e"`, ""}) {
		t.Errorf("splitWords: %q %v", got, err)
	}
	if _, err := splitWords(`a "b`); err == nil {
		t.Error("an unterminated quote split")
	}
}
