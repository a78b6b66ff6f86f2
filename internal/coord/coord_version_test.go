package coord_test

import (
	"context"
	"strings"
	"testing"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// TestJoinChecksAPIVersion: an agent of another API version is refused
// at join with an error that says both versions and what to do, and the
// node is not recorded; one that says none (older agents, API v1) or the
// coordinator's joins, its release recorded with the node.
func TestJoinChecksAPIVersion(t *testing.T) {
	e := newMemEnv(t, 1, memagent.Options{}, coord.Options{})
	c := e.start()
	ctx := context.Background()
	_, err := c.Join(ctx, coordv1.Join{Name: "new", Addr: "192.0.2.9:7420", Underlay: "192.0.2.9", API: "v2", Version: "v9.0.0"})
	if !isCode(err, coordv1.CodeVersion) || !strings.Contains(err.Error(), "agent new (v9.0.0) speaks API v2, this coordinator API "+coordv1.APIVersion) {
		t.Errorf("join of an agent of API v2: %v, want a version error naming both", err)
	}
	nodes, err := c.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Name == "new" {
			t.Errorf("the refused node is recorded: %+v", n)
		}
	}
	for _, j := range []coordv1.Join{
		{Name: "old", Addr: "192.0.2.10:7420", Underlay: "192.0.2.10"},
		{Name: "same", Addr: "192.0.2.11:7420", Underlay: "192.0.2.11", API: coordv1.APIVersion, Version: "v1.4.0"},
	} {
		if _, err := c.Join(ctx, j); err != nil {
			t.Errorf("join of %s (API %q): %v", j.Name, j.API, err)
		}
	}
	nodes, _ = c.Nodes(ctx)
	for _, n := range nodes {
		if n.Name == "same" && n.Version != "v1.4.0" {
			t.Errorf("node same recorded with version %q", n.Version)
		}
	}
}
