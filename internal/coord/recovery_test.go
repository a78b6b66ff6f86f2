package coord_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// A protocol scenario for TestCoordinatorDiesAnywhere.
type scenario struct {
	name  string
	nodes int
	// setup brings the cluster to where the protocol begins.
	setup func(t *testing.T, e *memEnv, c *memCoord)
	// run runs the protocol on c (it may fail: c may die during it).
	run func(ctx context.Context, c *memCoord) error
	// check checks the job once a new coordinator has settled it.
	check func(t *testing.T, e *memEnv, j *coordv1.Job)
	// survives: the job has a protected checkpoint and spare nodes, so
	// that in TestFaultMatrix whatever one fault does it must end running
	// (restarted by the coordinator on its own if need be).
	survives bool
}

var scenarios = []scenario{{
	name:  "start",
	nodes: 3,
	run: func(ctx context.Context, c *memCoord) error {
		_, err := c.RunJob(ctx, coordv1.RunJob{Name: "ring", Ranks: 4, Args: []string{"/bin/ring"}})
		return err
	},
	check: func(t *testing.T, e *memEnv, j *coordv1.Job) {
		if j == nil {
			return // the start was undone: the job's record is gone, nothing of it runs
		}
		if err := e.consistent(j, 0); err != nil {
			t.Fatal(err)
		}
	},
}, {
	name:  "checkpoint",
	nodes: 3,
	setup: func(t *testing.T, e *memEnv, c *memCoord) { c.runJob(t, "ring", 3, 0) },
	run: func(ctx context.Context, c *memCoord) error {
		_, err := c.Checkpoint(ctx, "ring", coordv1.CheckpointJob{})
		return err
	},
	check: func(t *testing.T, e *memEnv, j *coordv1.Job) {
		// The round ends aborted, with its aborts sent, or durable (then
		// protected: the job keeps no replica); durable means every
		// image is stored.
		var cks []coordv1.Ckpt
		waitFor(t, 10*time.Second, "round ended", func() bool {
			var err error
			cks, err = e.last.Checkpoints(context.Background(), "ring")
			return err == nil && len(cks) == 1 && (cks[0].State == coordv1.CkptAborted && !cks[0].Finished.IsZero() ||
				cks[0].State == coordv1.CkptProtected)
		})
		if err := e.consistent(j, 0); err != nil {
			t.Fatal(err)
		}
		if cks[0].State == coordv1.CkptProtected {
			for r, node := range j.Placement {
				if !e.mc.HasImage(node, fmt.Sprintf("ring.%d", r), cks[0].Seq) {
					t.Errorf("checkpoint durable, but %s has no image of rank %d", node, r)
				}
			}
		}
	},
}, {
	name:  "checkpoint-stop",
	nodes: 3,
	setup: func(t *testing.T, e *memEnv, c *memCoord) { c.runJob(t, "ring", 3, 0) },
	run: func(ctx context.Context, c *memCoord) error {
		_, err := c.Checkpoint(ctx, "ring", coordv1.CheckpointJob{Stop: true})
		return err
	},
	// The round aborted before its decision and the job runs on, or it
	// was decided commit and the job is stopped at it, nothing of it
	// running: every image stored, unless a commit failed (the coordinator
	// died sending it), and then the job says so.
	check: func(t *testing.T, e *memEnv, j *coordv1.Job) {
		var cks []coordv1.Ckpt
		waitFor(t, 10*time.Second, "round ended", func() bool {
			var err error
			cks, err = e.last.Checkpoints(context.Background(), "ring")
			return err == nil && len(cks) == 1 && (cks[0].State == coordv1.CkptAborted && !cks[0].Finished.IsZero() ||
				cks[0].State == coordv1.CkptProtected)
		})
		switch {
		case cks[0].State == coordv1.CkptProtected:
			stoppedAt(t, e, "ring", cks[0].Seq)
		case j.State == coordv1.JobRunning:
			if err := e.consistent(j, 0); err != nil {
				t.Fatal(err)
			}
		default:
			stoppedNotDurable(t, e, "ring", cks[0].Seq)
		}
	},
}, {
	name:  "restart",
	nodes: 4,
	setup: func(t *testing.T, e *memEnv, c *memCoord) {
		c.runJob(t, "ring", 3, 0, "n0", "n1", "n2")
		c.checkpoint(t, "ring", 0)
	},
	// Every rank moves one node on: each fetches its image, n0 is left.
	run: func(ctx context.Context, c *memCoord) error {
		_, err := c.Restart(ctx, "ring", coordv1.Restart{Placement: []string{"n1", "n2", "n3"}})
		return err
	},
	check: func(t *testing.T, e *memEnv, j *coordv1.Job) {
		if err := e.consistent(j, 1); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.mc.JobNets(j.VNI)["n0"]; ok && j.Placement[0] != "n0" {
			t.Errorf("n0, which the job left, still has its network")
		}
	},
}, {
	name:  "migration",
	nodes: 3,
	setup: func(t *testing.T, e *memEnv, c *memCoord) { c.runJob(t, "ring", 3, 0, "n0", "n1") },
	run: func(ctx context.Context, c *memCoord) error {
		_, err := c.Migrate(ctx, "ring", coordv1.Migrate{Rank: 1, To: "n2"})
		return err
	},
	check: func(t *testing.T, e *memEnv, j *coordv1.Job) {
		if err := e.consistent(j, 0); err != nil {
			t.Fatal(err)
		}
		ms, err := e.last.Migrations(context.Background(), "ring")
		if err != nil || len(ms) != 1 {
			t.Fatalf("migrations: %+v %v", ms, err)
		}
		if want := map[coordv1.MigrationState]string{coordv1.MigrationDone: "n2", coordv1.MigrationFailed: "n1"}[ms[0].State]; j.Placement[1] != want {
			t.Errorf("migration %s, rank 1 on %s, want %s", ms[0].State, j.Placement[1], want)
		}
	},
}}

// TestCoordinatorDiesAnywhere kills the coordinator after each call to an
// agent that a protocol makes (and so between any two of its steps: a
// phase recorded, a failpoint), starts another one on the same catalog,
// and checks that it brings the job to a consistent state: every rank
// once, where the catalog places it, running, nothing frozen or held; a
// restart finished from its checkpoint; a migration done or undone. The
// agents' holds are far longer than the test, so that the new coordinator
// alone must settle everything.
func TestCoordinatorDiesAnywhere(t *testing.T) {
	opts := coord.Options{Hold: 10 * time.Minute, Deadline: 5 * time.Second}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			// A run without death counts the protocol's calls.
			e := newMemEnv(t, sc.nodes, memagent.Options{Hold: 10 * time.Minute}, opts)
			c1 := e.start()
			if sc.setup != nil {
				sc.setup(t, e, c1)
			}
			before := e.mc.Calls(c1.name)
			if err := sc.run(c1.ctx, c1); err != nil {
				t.Fatalf("undisturbed run: %v", err)
			}
			calls := e.mc.Calls(c1.name) - before
			t.Logf("%s: %d calls to agents", sc.name, calls)
			for n := 1; n <= calls; n++ {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					e := newMemEnv(t, sc.nodes, memagent.Options{Hold: 10 * time.Minute}, opts)
					c1 := e.start()
					if sc.setup != nil {
						sc.setup(t, e, c1)
					}
					e.killAfter(c1, n)
					ran := make(chan error, 1)
					go func() { ran <- sc.run(c1.ctx, c1) }()
					// A dead coordinator's request may take a while to
					// give up on its closed catalog: the next one does
					// not wait for it.
					waitFor(t, 10*time.Second, "the first coordinator's death", func() bool { return c1.ctx.Err() != nil })
					e.kill(c1)
					defer func() { t.Logf("the first coordinator, dead after call %d: %v", n, <-ran) }()
					c2 := e.start()
					e.last = c2
					sc.check(t, e, e.settled(c2, "ring", 20*time.Second))
				})
			}
		})
	}
}
