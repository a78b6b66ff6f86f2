package container_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestCopyLogFollows: following a container's log gives everything it
// prints, and ends when it exits.
func TestCopyLogFollows(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	if _, err := env.Manager.Run(ctx, container.Config{Name: "talk", Args: []string{"sh", "-c", "echo one; sleep 1; echo two"}}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := env.Manager.CopyLog(ctx, &out, "talk", container.LogOptions{Follow: true}); err != nil {
		t.Fatal(err)
	}
	if out.String() != "one\ntwo\n" {
		t.Errorf("followed log %q, want both lines", out.String())
	}
	if err := env.Manager.CopyLog(ctx, &out, "talk", container.LogOptions{Incarnation: 7}); err == nil {
		t.Error("the log of an incarnation that never was")
	}
}

// TestCheckHost: every check is there, in order; a runc that is not
// there fails its check and says why.
func TestCheckHost(t *testing.T) {
	checks := container.CheckHost(context.Background(), "", "/nonexistent/runc")
	var names []string
	for _, c := range checks {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, []string{"criu", "runc", "ip", "iptables", "clocks", "caps"}) {
		t.Fatalf("checks %v", names)
	}
	if checks[1].OK || checks[1].Detail == "" {
		t.Errorf("a missing runc: %+v", checks[1])
	}
	// The bounding set, as this process has it: a root without
	// CAP_SYS_RESOURCE is a limit, not a failure.
	if clocks := checks[4]; !clocks.OK || clocks.Limit {
		t.Errorf("clocks: %+v, want time namespaces (this kernel has them)", clocks)
	}
	caps := checks[5]
	if !caps.OK {
		t.Errorf("caps: %+v, want OK (a limit at most)", caps)
	}
	if caps.Limit != !strings.Contains(caps.Detail, "in the bounding set: processes of every user") || !strings.Contains(caps.Detail, "CAP_SYS_RESOURCE") {
		t.Errorf("caps: %+v", caps)
	}
	t.Logf("caps: %+v", caps)
}

// TestCheckHostWithoutSysResource: `cairn check` run without
// CAP_SYS_RESOURCE in its bounding set (capsh drops it) says what that
// limits, and still passes.
func TestCheckHostWithoutSysResource(t *testing.T) {
	bin := testutil.CairnBinary(t)
	out, err := exec.Command("capsh", "--drop=cap_sys_resource", "--", "-c", bin+" check --json").Output()
	if err != nil {
		t.Fatalf("cairn check without CAP_SYS_RESOURCE: %v\n%s", err, out)
	}
	var checks []container.HostCheck
	if err := json.Unmarshal(out, &checks); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	last := checks[len(checks)-1]
	if last.Name != "caps" || !last.OK || !last.Limit || !strings.Contains(last.Detail, "Can't get rlimit") || !strings.Contains(last.Detail, "docs/limits.md") {
		t.Fatalf("caps without CAP_SYS_RESOURCE: %+v", last)
	}
}
