package coord_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// TestProtocolsOnALossyNetwork runs a job's life (start, checkpoints, a
// migration, restarts) on a network that loses one call in ten, before or
// after it is carried out, and delays every call, from a seeded source.
// Any protocol may fail; none may leave the job inconsistent: once the
// agents' holds have run out, a running job has every rank once, where
// its record says, running; a failed one runs nothing. What each protocol
// reported is what it did: the job runs where it was asked to; a round
// that returned is durable, with every rank's image on the rank's node,
// and one that aborted is aborted; the rank is where its migration's
// outcome puts it; a restart that returned runs every rank from the
// checkpoint. With the network healed, a restart brings the job back from
// that checkpoint and the job takes a new one. A seed whose job never
// starts, or never gets a checkpoint, fails. Five seeds here; a hundred
// with CAIRN_SOAK=1 (make soak).
func TestProtocolsOnALossyNetwork(t *testing.T) {
	// Holds short enough for the test to outwait them; a round's
	// deadline shorter than its hold (the coordinator's rule).
	const hold = 600 * time.Millisecond
	// On this network about one round in two aborts (fewer starts fail):
	// all of 20 tries fail about once in a million seeds.
	const tries = 20
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
			try := func(what string, fn func() error) {
				t.Helper()
				for i := range tries {
					err := fn()
					if err == nil {
						t.Logf("%s: done at try %d", what, i+1)
						return
					}
					t.Logf("%s: %v", what, err)
					e.quiet(c, "ring", hold)
				}
				t.Fatalf("%s: not done in %d tries", what, tries)
			}

			nodes := []string{"n0", "n1", "n2"}
			try("run", func() error {
				_, err := c.RunJob(ctx, coordv1.RunJob{Name: "ring", Ranks: 3, Replicas: 1, Args: []string{"/bin/ring"}, Nodes: nodes})
				return err
			})
			j := e.quiet(c, "ring", hold)
			if j.State != coordv1.JobRunning || !slices.Equal(j.Placement, nodes) {
				t.Fatalf("job started: %s on %v, want running on %v", j.State, j.Placement, nodes)
			}

			durable := map[int]bool{} // every round's outcome, as its caller was told
			seq := 0
			try("checkpoint", func() error {
				ck, err := c.Checkpoint(ctx, "ring", coordv1.CheckpointJob{})
				if ck != nil {
					durable[ck.Seq] = err == nil
				}
				if err == nil {
					seq = ck.Seq
				}
				return err
			})
			checkRounds(t, c, "ring", durable)
			for r, node := range j.Placement {
				if !e.mc.HasImage(node, agentv1.RankName("ring", r), seq) {
					t.Fatalf("checkpoint %d is durable, but node %s has no image of rank %d:\n%s", seq, node, r, e.mc.Describe("ring"))
				}
			}

			restarts := j.Restarts
			_, err := c.Migrate(ctx, "ring", coordv1.Migrate{Rank: 1, To: "n3"})
			t.Logf("migrate: %v", err)
			j = e.quiet(c, "ring", hold)
			checkMigration(t, c, j, restarts, seq, err)

			restarts = j.Restarts
			_, err = c.Restart(ctx, "ring", coordv1.Restart{})
			t.Logf("restart: %v", err)
			j = e.quiet(c, "ring", hold)
			if err == nil {
				if j.Restarts <= restarts {
					t.Fatalf("the restart returned, but the job counts %d restarts, as before it", j.Restarts)
				}
				if err := e.consistent(j, seq); err != nil {
					t.Fatalf("the restart returned, but: %v", err)
				}
			}

			// Healed, a restart (unless the job runs from the checkpoint
			// already) brings it back from the checkpoint, and it takes
			// new ones.
			e.mc.SetNetwork(0, 0)
			j = e.quiet(c, "ring", hold)
			if j.State != coordv1.JobRunning || j.RestoredFrom != seq {
				if _, err := c.Restart(ctx, "ring", coordv1.Restart{From: seq}); err != nil {
					t.Fatalf("restart on a healed network: %v", err)
				}
				j = e.quiet(c, "ring", hold)
			}
			if err := e.consistent(j, seq); err != nil {
				t.Fatal(err)
			}
			if next := c.checkpoint(t, "ring", 1); next <= seq {
				t.Fatalf("a checkpoint on the healed network is numbered %d, after %d", next, seq)
			}
		})
	}
}

// checkRounds checks that the job's checkpoint records are the rounds
// taken, each as its caller was told: durable (or protected since) if
// the round returned, aborted if it failed.
func checkRounds(t *testing.T, c *memCoord, job string, durable map[int]bool) {
	t.Helper()
	cks, err := c.Checkpoints(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, ck := range cks {
		ok, taken := durable[ck.Seq]
		seen[ck.Seq] = true
		switch {
		case !taken:
			t.Errorf("checkpoint %d (%s) was taken by no call", ck.Seq, ck.State)
		case ok && ck.State != coordv1.CkptDurable && ck.State != coordv1.CkptProtected:
			t.Errorf("checkpoint %d returned, but is %s (%s)", ck.Seq, ck.State, ck.Reason)
		case !ok && ck.State != coordv1.CkptAborted:
			t.Errorf("checkpoint %d failed, but is %s", ck.Seq, ck.State)
		}
	}
	for s := range durable {
		if !seen[s] {
			t.Errorf("checkpoint %d has no record", s)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// checkMigration checks that the one migration of job j (rank 1, from n1
// to n3), which returned err, left the rank where its outcome says: on
// n3 if done (it returns only then), on n1 if failed. If the job was
// restarted since (it counted restarts before), it runs from checkpoint
// seq instead.
func checkMigration(t *testing.T, c *memCoord, j *coordv1.Job, restarts, seq int, err error) {
	t.Helper()
	ms, merr := c.Migrations(context.Background(), j.Name)
	if merr != nil {
		t.Fatal(merr)
	}
	if len(ms) != 1 {
		t.Fatalf("%d migrations recorded, want 1: %+v", len(ms), ms)
	}
	m := ms[0]
	if m.Rank != 1 || m.From != "n1" || m.To != "n3" {
		t.Fatalf("migration recorded as rank %d from %s to %s, want rank 1 from n1 to n3", m.Rank, m.From, m.To)
	}
	want := ""
	switch m.State {
	case coordv1.MigrationDone:
		want = m.To
	case coordv1.MigrationFailed:
		want = m.From
		if err == nil {
			t.Fatalf("the migration returned, but is %s (%s)", m.State, m.Reason)
		}
	default:
		t.Fatalf("the migration is %s after the job settled", m.State)
	}
	if j.Restarts != restarts {
		t.Logf("the job restarted during the migration (%s)", m.State)
		if j.State == coordv1.JobRunning && j.RestoredFrom != seq {
			t.Fatalf("the job restarted from %d, want %d", j.RestoredFrom, seq)
		}
		return
	}
	if j.Placement[m.Rank] != want {
		t.Fatalf("migration %s of rank %d from %s to %s, but the rank is placed on %s", m.State, m.Rank, m.From, m.To, j.Placement[m.Rank])
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
