package testbed

import (
	"slices"
	"testing"
	"time"
)

// TestCoordinatorArgs: every coordinator option of a Config reaches the
// coordinator's command line, and an unset one is left to its default.
func TestCoordinatorArgs(t *testing.T) {
	c := &Cluster{dir: "/d", Coordinator: "10.0.0.1:7400", UI: "http://127.0.0.1:7401/ui/"}
	cfg := Config{JobSubnets: "10.99.0.0/16", Deadline: 3 * time.Second, NodeTTL: 4 * time.Second,
		MTBF: 2 * time.Hour, Hooks: []string{"a=exec:/bin/true", "b=exec:/bin/false"},
		HookSecretFile: "/s", HookCA: "/ca", MetricsTokenFile: "/tok"}
	args := cfg.coordinatorArgs(c)
	for _, want := range [][]string{
		{"--listen", "10.0.0.1:7400"},
		{"--job-subnets", "10.99.0.0/16"},
		{"--deadline", "3s"},
		{"--node-ttl", "4s"},
		{"--mtbf", "2h0m0s"},
		{"--hook", "a=exec:/bin/true"},
		{"--hook", "b=exec:/bin/false"},
		{"--ui-listen", "127.0.0.1:7401"},
		{"--hook-secret-file", "/s"},
		{"--hook-ca", "/ca"},
		{"--metrics-token-file", "/tok"},
	} {
		if !hasPair(args, want[0], want[1]) {
			t.Errorf("no %s %s in %q", want[0], want[1], args)
		}
	}
	bare := Config{}.coordinatorArgs(&Cluster{dir: "/d", Coordinator: "10.0.0.1:7400"})
	for _, flag := range []string{"--job-subnets", "--deadline", "--node-ttl", "--mtbf", "--hook", "--ui-listen", "--metrics-token-file"} {
		if slices.Contains(bare, flag) {
			t.Errorf("%s given though unset: %q", flag, bare)
		}
	}
}

func hasPair(args []string, flag, value string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag && args[i+1] == value {
			return true
		}
	}
	return false
}
