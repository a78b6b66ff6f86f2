package coord_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	agentv1 "cairn/api/agent/v1"
	coordv1 "cairn/api/coord/v1"
	"cairn/internal/coord"
	"cairn/internal/coord/memagent"
)

// TestProtocolsOnALossyNetwork runs a job's life (start, checkpoints, a
// migration, restarts) on a network that loses one call in ten, before or
// after it is carried out, and delays every call, from a seeded source.
// Any protocol may fail; none may leave the job inconsistent: once the
// agents' holds have run out, a running job has every rank once, where
// its record says, running; a failed one runs nothing. With the network
// healed, a restart brings the job back from its newest checkpoint.
// Five seeds here; a hundred with CAIRN_SOAK=1 (make soak).
func TestProtocolsOnALossyNetwork(t *testing.T) {
	// Holds short enough for the test to outwait them; a round's
	// deadline shorter than its hold (the coordinator's rule).
	const hold = 600 * time.Millisecond
	seeds := uint64(5)
	if os.Getenv("CAIRN_SOAK") != "" {
		seeds = 100
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			e := newMemEnv(t, 4, memagent.Options{Seed: seed, Hold: hold}, coord.Options{Hold: hold, Deadline: 250 * time.Millisecond})
			c := e.start()
			ctx := context.Background()
			e.mc.SetNetwork(0.1, 2*time.Millisecond)
			// Each step, tried until it works (a few times).
			try := func(what string, fn func() error) bool {
				for range 8 {
					err := fn()
					if err == nil {
						return true
					}
					t.Logf("%s: %v", what, err)
					e.quiet(c, "ring", hold)
				}
				return false
			}
			if !try("run", func() error {
				_, err := c.RunJob(ctx, coordv1.RunJob{Name: "ring", Ranks: 3, Replicas: 1, Args: []string{"/bin/ring"}, Nodes: []string{"n0", "n1", "n2"}})
				return err
			}) {
				t.Skip("the job never started on this network")
			}
			seq := 0
			try("checkpoint", func() error {
				ck, err := c.Checkpoint(ctx, "ring", false)
				if err == nil {
					seq = ck.Seq
				}
				return err
			})
			_, err := c.Migrate(ctx, "ring", 1, "n3")
			t.Logf("migrate: %v", err)
			e.quiet(c, "ring", hold)
			if seq > 0 {
				_, err = c.Restart(ctx, "ring", coordv1.Restart{})
				t.Logf("restart: %v", err)
				e.quiet(c, "ring", hold)
			}
			// Healed, a restart (from the newest checkpoint, if any) works.
			e.mc.SetNetwork(0, 0)
			j := e.quiet(c, "ring", hold)
			if seq == 0 || j.State == coordv1.JobRunning && j.RestoredFrom == seq {
				return
			}
			if _, err := c.Restart(ctx, "ring", coordv1.Restart{From: seq}); err != nil {
				t.Fatalf("restart on a healed network: %v", err)
			}
			if err := e.consistent(e.quiet(c, "ring", hold), seq); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// quiet waits for the job to settle and for the agents' holds to run out,
// checks that the job is consistent (running: as its record says; failed:
// nothing of it runs), and returns its record.
func (e *memEnv) quiet(c *memCoord, job string, hold time.Duration) *coordv1.Job {
	e.t.Helper()
	e.settled(c, job, 20*time.Second)
	time.Sleep(2 * hold)
	j := e.settled(c, job, 20*time.Second)
	if j == nil {
		for r, vs := range e.mc.Ranks(job) {
			e.t.Fatalf("job %s is gone but rank %d has %d containers:\n%s", job, r, len(vs), e.mc.Describe(job))
		}
		return &coordv1.Job{}
	}
	switch j.State {
	case coordv1.JobRunning:
		if err := e.consistent(j, 0); err != nil {
			e.t.Fatal(err)
		}
	default:
		for r, vs := range e.mc.Ranks(job) {
			for _, v := range vs {
				if v.Status == agentv1.StatusRunning {
					e.t.Fatalf("job %s is %s, but rank %d runs on %s:\n%s", job, j.State, r, v.Node, e.mc.Describe(job))
				}
			}
		}
	}
	return j
}
