package coord_test

import (
	"context"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// TestStaleCoordinatorFenced: a coordinator that was replaced but still
// runs (not cut off: it reaches every agent) can no longer act on a job
// once its successor has called the agents: they refuse its older term.
// Without the check, its round would freeze and dump the ranks under the
// new coordinator's feet.
func TestStaleCoordinatorFenced(t *testing.T) {
	e := newMemEnv(t, 2, memagent.Options{}, coord.Options{})
	old := e.start()
	ctx := context.Background()
	old.runJob(t, "ring", 2, 0, "n0", "n1")
	old.checkpoint(t, "ring", 0)

	cur := e.start() // the old one runs on
	if !old.Term().Older(cur.Term()) {
		t.Fatalf("terms: new %s, old %s; want the old one older", cur.Term(), old.Term())
	}
	seq := cur.checkpoint(t, "ring", 0)
	waitFor(t, 5*time.Second, "the old coordinator to see it was replaced", func() bool {
		newer, ok := old.Replaced()
		return ok && newer == cur.Term()
	})

	_, err := old.Checkpoint(ctx, "ring", coordv1.CheckpointJob{})
	if err == nil {
		t.Fatal("the replaced coordinator took a round")
	}
	t.Logf("the replaced coordinator's round: %v", err)
	if _, err := old.KillJob(ctx, "ring", 0); !isCode(err, agentv1.CodeStaleTerm) {
		t.Errorf("the replaced coordinator's kill: %v, want %s", err, agentv1.CodeStaleTerm)
	}
	for r, views := range e.mc.Ranks("ring") {
		for _, v := range views {
			if v.Status != agentv1.StatusRunning || v.Locked {
				t.Errorf("rank %d on %s is %s (locked %v) after the old coordinator's tries", r, v.Node, v.Status, v.Locked)
			}
		}
	}
	// The new coordinator goes on.
	if next := cur.checkpoint(t, "ring", 0); next <= seq {
		t.Errorf("the new coordinator's next round is %d, after %d", next, seq)
	}
	if st, err := cur.Status(ctx, "ring"); err != nil || st.State != coordv1.JobRunning {
		t.Errorf("job after all: %v, %v", st, err)
	}
}
