package coord_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// stoppedAt checks that job is stopped at checkpoint seq: the job says so,
// every rank's image of seq is stored on its node, and no container of the
// job is live (each ended at the checkpoint, or killed after it).
func stoppedAt(t *testing.T, e *memEnv, job string, seq int) {
	t.Helper()
	j := stopped(t, e, job, seq)
	if want := fmt.Sprintf("stopped at checkpoint %d", seq); j.Reason != want {
		t.Errorf("job %s stopped for %q, want %q", job, j.Reason, want)
	}
	for r, node := range j.Placement {
		if !e.mc.HasImage(node, fmt.Sprintf("%s.%d", job, r), seq) {
			t.Errorf("job stopped at %d, but %s has no image of rank %d", seq, node, r)
		}
	}
}

// stoppedNotDurable checks that job is stopped at checkpoint seq, which
// did not become durable, and says so.
func stoppedNotDurable(t *testing.T, e *memEnv, job string, seq int) {
	t.Helper()
	j := stopped(t, e, job, seq)
	if want := fmt.Sprintf("stopped at checkpoint %d, which is not durable", seq); !strings.HasPrefix(j.Reason, want) {
		t.Errorf("job %s stopped for %q, want it to begin %q", job, j.Reason, want)
	}
}

// stopped waits until job is stopped at seq, and checks that nothing of
// it runs anywhere.
func stopped(t *testing.T, e *memEnv, job string, seq int) *coordv1.Job {
	t.Helper()
	var j *coordv1.Job
	waitFor(t, 10*time.Second, "job "+job+" stopped", func() bool {
		st, err := e.last.Status(context.Background(), job)
		if err != nil {
			return false
		}
		j = &st.Job
		return j.State == coordv1.JobStopped && !strings.HasPrefix(j.Reason, "stopping")
	})
	if j.StoppedAt != seq {
		t.Errorf("job %s stopped at %d, want %d", job, j.StoppedAt, seq)
	}
	for r, vs := range e.mc.Ranks(job) {
		for _, v := range vs {
			if v.Status.Live() {
				t.Errorf("rank %d on %s is %s: a stopped job must run nowhere\n%s", r, v.Node, v.Status, e.mc.Describe(job))
			}
		}
	}
	return j
}

// TestCheckpointStop: a checkpoint with stop ends every rank at it, while
// still frozen and locked, and the job is stopped; it stays so (nothing
// takes its ranks' ends for its end, nothing checkpoints it); cairn
// restart resumes it from that checkpoint.
func TestCheckpointStop(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c := e.start()
	e.last = c
	c.runJob(t, "ring", 3, 0)
	c.checkpoint(t, "ring", 0)
	ck, err := c.Checkpoint(context.Background(), "ring", coordv1.CheckpointJob{Stop: true})
	if err != nil {
		t.Fatal(err)
	}
	if !ck.Stop || ck.State != coordv1.CkptDurable || ck.Seq != 2 {
		t.Fatalf("checkpoint with stop: %+v, want checkpoint 2 durable, stop", ck)
	}
	stoppedAt(t, e, "ring", 2)
	for r, vs := range e.mc.Ranks("ring") {
		if len(vs) != 1 || vs[0].Status != agentv1.StatusCheckpointed || !vs[0].Locked {
			t.Errorf("rank %d: %+v, want one container, checkpointed, its network locked", r, vs)
		}
	}
	// Heartbeats report the ended ranks; the job stays stopped.
	time.Sleep(2 * memTTL)
	stoppedAt(t, e, "ring", 2)
	if _, err := c.Checkpoint(context.Background(), "ring", coordv1.CheckpointJob{}); !isCode(err, coordv1.CodeConflict) {
		t.Errorf("checkpoint of a stopped job: %v, want a conflict", err)
	}
	if _, err := c.Restart(context.Background(), "ring", coordv1.Restart{}); err != nil {
		t.Fatal(err)
	}
	j := e.settled(c, "ring", 10*time.Second)
	if err := e.consistent(j, 2); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointStopAborts: a stop round that aborts stops nothing: the
// job runs on, and the error says so.
func TestCheckpointStopAborts(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	e.wrap = func(node string, a coord.Agent) coord.Agent {
		if node != "n1" {
			return a
		}
		return failPrepare{a}
	}
	c := e.start()
	e.last = c
	c.runJob(t, "ring", 3, 0, "n0", "n1", "n2")
	_, err := c.Checkpoint(context.Background(), "ring", coordv1.CheckpointJob{Stop: true})
	if !isCode(err, coordv1.CodeAborted) || !strings.Contains(err.Error(), "runs on") {
		t.Fatalf("stop round with a failed prepare: %v, want it aborted, saying the job runs on", err)
	}
	j := e.settled(c, "ring", 10*time.Second)
	if err := e.consistent(j, 0); err != nil {
		t.Fatal(err)
	}
}

// failPrepare is an agent whose prepares fail.
type failPrepare struct{ coord.Agent }

func (a failPrepare) Prepare(ctx context.Context, req agentv1.Prepare) (agentv1.Prepared, error) {
	return agentv1.Prepared{}, &agentv1.Error{Code: agentv1.CodeInternal, Message: "dump failed"}
}

// TestRankAskedStop: a rank's checkpoint with stop is the same stop round
// as cairn checkpoint --stop's; the stopped job takes no further rounds.
func TestRankAskedStop(t *testing.T) {
	e := newMemEnv(t, 2, memagent.Options{}, coord.Options{})
	c := e.start()
	e.last = c
	j := c.runJob(t, "ring", 2, 0, "n0", "n1")
	ck, err := c.RankCheckpoint(context.Background(), j.Placement[1], coordv1.RankRequest{Job: "ring", Rank: 1, Stop: true})
	if err != nil {
		t.Fatal(err)
	}
	if !ck.Stop {
		t.Errorf("the round a rank asked to stop at is %+v, not a stop round", ck)
	}
	stoppedAt(t, e, "ring", ck.Seq)
	_, err = c.RankCheckpoint(context.Background(), j.Placement[0], coordv1.RankRequest{Job: "ring", Rank: 0})
	if !isCode(err, coordv1.CodeConflict) {
		t.Errorf("a rank's checkpoint of its stopped job: %v, want a conflict", err)
	}
}
