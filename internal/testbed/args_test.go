package testbed

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/netw"
)

// TestCoordinatorArgs: every coordinator option of a Config reaches the
// coordinator's command line, and an unset one is left to its default.
func TestCoordinatorArgs(t *testing.T) {
	co := Coord{Name: "c1", Addr: "10.0.0.1:7400", Dir: "/d/coordinator"}
	c := &Cluster{dir: "/d", Coordinator: co.Addr, Coordinators: []Coord{co}, UI: "http://127.0.0.1:7401/ui/"}
	cfg := Config{JobSubnets: "10.99.0.0/16", Deadline: 3 * time.Second, NodeTTL: 4 * time.Second,
		MTBF: 2 * time.Hour, Hooks: []string{"a=exec:/bin/true", "b=exec:/bin/false"},
		HookSecretFile: "/s", HookCA: "/ca", MetricsTokenFile: "/tok"}
	args := cfg.coordinatorArgs(c, co)
	for _, want := range [][]string{
		{"--listen", "10.0.0.1:7400"},
		{"--name", "c1"},
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
	c.UI = ""
	bare := Config{}.coordinatorArgs(c, co)
	for _, flag := range []string{"--job-subnets", "--deadline", "--node-ttl", "--mtbf", "--hook", "--ui-listen", "--metrics-token-file", "--peers"} {
		if slices.Contains(bare, flag) {
			t.Errorf("%s given though unset: %q", flag, bare)
		}
	}
}

// TestCoordinatorArgsPeers: each of several coordinators is told every
// one's etcd peer URL, its own name among them.
func TestCoordinatorArgsPeers(t *testing.T) {
	c := &Cluster{dir: "/d", Coordinators: []Coord{
		{Name: "c1", Addr: "10.0.0.1:7400", Peer: "https://10.0.0.1:7410", Dir: "/d/coordinator"},
		{Name: "c2", Addr: "10.0.0.1:7401", Peer: "https://10.0.0.1:7411", Dir: "/d/coordinator-c2"},
		{Name: "c3", Addr: "10.0.0.1:7402", Peer: "https://10.0.0.1:7412", Dir: "/d/coordinator-c3"},
	}}
	args := Config{}.coordinatorArgs(c, c.Coordinators[1])
	for _, want := range [][]string{
		{"--name", "c2"}, {"--listen", "10.0.0.1:7401"}, {"--dir", "/d/coordinator-c2"},
		{"--peers", "c1=https://10.0.0.1:7410,c2=https://10.0.0.1:7411,c3=https://10.0.0.1:7412"},
	} {
		if !hasPair(args, want[0], want[1]) {
			t.Errorf("no %s %s in %q", want[0], want[1], args)
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

// TestClockOffsets: offsets are keyed by a node's full or short name and
// given in whole seconds; another node or a fraction of a second is
// refused with what there is.
func TestClockOffsets(t *testing.T) {
	cl, err := netw.NewCluster("tb-", netip.MustParsePrefix("10.250.0.0/24"), 3)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Prefix: "tb-", ClockOffsets: map[string]time.Duration{"n2": 240 * time.Hour, "tb-n3": -time.Hour}}
	got, err := cfg.clockOffsets(cl.Nodes)
	if err != nil || len(got) != 2 || got["tb-n2"] != 864000 || got["tb-n3"] != -3600 {
		t.Fatalf("offsets %v, %v", got, err)
	}
	for key, d := range map[string]time.Duration{"n4": time.Hour, "n1": 1500 * time.Millisecond} {
		cfg.ClockOffsets = map[string]time.Duration{key: d}
		if _, err := cfg.clockOffsets(cl.Nodes); err == nil {
			t.Errorf("offset %s of %s accepted", d, key)
		} else {
			t.Log(err)
		}
	}
}
