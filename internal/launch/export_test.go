package launch_test

import (
	"slices"
	"testing"

	"github.com/cairn-hpc/cairn/internal/launch"
)

// TestExportEnv: ALL passes the caller's environment less its session's;
// NONE passes nothing; a list passes those variables only.
func TestExportEnv(t *testing.T) {
	env := []string{"PATH=/usr/bin", "OMP_NUM_THREADS=4", "SSH_AUTH_SOCK=/tmp/a", "DISPLAY=:0", "CAIRN_DATA=/x", "XDG_RUNTIME_DIR=/run/u", "HOME=/root", "PWD=/w"}
	for _, tc := range []struct {
		spec string
		want []string
	}{
		{"ALL", []string{"PATH=/usr/bin", "OMP_NUM_THREADS=4", "HOME=/root"}},
		{"NONE", nil},
		{"OMP_NUM_THREADS,HOME,NOT_SET", []string{"OMP_NUM_THREADS=4", "HOME=/root"}},
	} {
		got, err := launch.ExportEnv(tc.spec, env)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("export %s: %v %v, want %v", tc.spec, got, err, tc.want)
		}
	}
	for _, bad := range []string{"A=B", "A,,B", "A B"} {
		if _, err := launch.ExportEnv(bad, env); err == nil {
			t.Errorf("export %q accepted", bad)
		}
	}
}
