package container_test

import (
	"bytes"
	"context"
	"testing"

	"cairn/internal/container"
	"cairn/internal/testutil"
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
	if len(checks) != 4 || names[0] != "criu" || names[1] != "runc" || names[2] != "ip" || names[3] != "iptables" {
		t.Fatalf("checks %v", names)
	}
	if checks[1].OK || checks[1].Detail == "" {
		t.Errorf("a missing runc: %+v", checks[1])
	}
}
