package coord_test

import (
	"context"
	"slices"
	"testing"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// TestFencedRanks: a node that froze its ranks while it heard no
// coordinator is told, with its next heartbeat, to thaw those its jobs
// still place on it and to stop the others (placed elsewhere, of a job
// that is gone); names that are no rank are ignored.
func TestFencedRanks(t *testing.T) {
	e := newMemEnv(t, 2, memagent.Options{}, coord.Options{})
	c := e.start()
	ctx := context.Background()
	j := c.runJob(t, "ring", 2, 0, "n0", "n1")
	fenced := []string{agentv1.RankName("ring", 0), agentv1.RankName("ring", 1), agentv1.RankName("gone", 0), "no-rank"}
	rep, err := c.Heartbeat(ctx, coordv1.Heartbeat{Name: j.Placement[0], Fenced: fenced})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{agentv1.RankName("ring", 0)}; !slices.Equal(rep.Release, want) {
		t.Errorf("release %v, want %v", rep.Release, want)
	}
	if want := []string{agentv1.RankName("ring", 1), agentv1.RankName("gone", 0)}; !slices.Equal(rep.Drop, want) {
		t.Errorf("drop %v, want %v", rep.Drop, want)
	}
	// A job that no longer runs keeps none of its ranks.
	if _, err := c.KillJob(ctx, "ring", 9); err != nil {
		t.Fatal(err)
	}
	rep, err = c.Heartbeat(ctx, coordv1.Heartbeat{Name: j.Placement[0], Fenced: fenced[:1]})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Release) != 0 || !slices.Equal(rep.Drop, fenced[:1]) {
		t.Errorf("after the kill: release %v, drop %v; want none, %v", rep.Release, rep.Drop, fenced[:1])
	}
}
