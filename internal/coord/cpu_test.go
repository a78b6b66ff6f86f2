package coord_test

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// TestCPUFeaturesPlacement: nodes report their CPU features at join; a
// job records those of the nodes its ranks started on; a migration or a
// restart never puts a rank on a node that lacks one of them (its
// processes could die of SIGILL there), and says which are missing when
// asked to; nodes that have them all are used.
func TestCPUFeaturesPlacement(t *testing.T) {
	e := newMemEnv(t, 4, memagent.Options{}, coord.Options{})
	full := []string{"avx2", "avx512f", "sse2"}
	for _, n := range []string{"n0", "n1", "n2"} {
		e.mc.Node(n).SetCPU(full)
	}
	e.mc.Node("n3").SetCPU([]string{"avx2", "sse2"})
	mc := e.start()
	ctx := context.Background()
	nodes, err := mc.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if len(n.CPU) == 0 {
			t.Fatalf("node %s recorded without its CPU features", n.Name)
		}
	}
	j := mc.runJob(t, "ring", 2, 1, "n0", "n1")
	if !slices.Equal(j.CPU, full) {
		t.Fatalf("job's CPU features %v, want its nodes' %v", j.CPU, full)
	}
	mc.checkpoint(t, "ring", 1)

	_, err = mc.Migrate(ctx, "ring", coordv1.Migrate{Rank: 0, To: "n3"})
	if !isCode(err, coordv1.CodeNoNodes) || !strings.Contains(err.Error(), "node n3 lacks CPU features job ring's ranks started with (avx512f)") {
		t.Fatalf("migrate onto a node without avx512f: %v", err)
	}
	m, err := mc.Migrate(ctx, "ring", coordv1.Migrate{Rank: 0})
	if err != nil {
		t.Fatal(err)
	}
	if m.To != "n2" {
		t.Fatalf("migrated to %s; n2 is the only other node with the job's CPU features", m.To)
	}
	e.settled(mc, "ring", 10*time.Second)

	if _, err := mc.KillJob(ctx, "ring", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "ring killed", func() bool {
		j, err := mc.Status(ctx, "ring")
		return err == nil && j.State == coordv1.JobKilled
	})
	_, err = mc.Restart(ctx, "ring", coordv1.Restart{Placement: []string{"n3", "n1"}})
	if !isCode(err, coordv1.CodeNoNodes) || !strings.Contains(err.Error(), "node n3 lacks") {
		t.Fatalf("restart placed on n3: %v", err)
	}
	_, err = mc.Restart(ctx, "ring", coordv1.Restart{Nodes: []string{"n3"}})
	if !isCode(err, coordv1.CodeNoNodes) || !strings.Contains(err.Error(), "n3 lacks avx512f") {
		t.Fatalf("restart on n3 only: %v", err)
	}
	j, err = mc.Restart(ctx, "ring", coordv1.Restart{})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(j.Placement, "n3") {
		t.Fatalf("restarted on %v, n3 among them", j.Placement)
	}
}
