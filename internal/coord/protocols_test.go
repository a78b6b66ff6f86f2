package coord_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// The traces below are the coordinator's protocols as its agents see
// them: every call, between the phases the coordinator records
// (testdata/traces; go test -rewrite regenerates them, to be reviewed as
// a diff).

// TestTraceJobStart: a job of four ranks on three nodes starts.
func TestTraceJobStart(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c1 := e.start()
	j := c1.runJob(t, "ring", 4, 0)
	golden(t, "job_start", e.takeTrace())
	if err := e.consistent(j, 0); err != nil {
		t.Fatal(err)
	}
}

// TestTraceCheckpoint: a global checkpoint of a job with one replica per
// image, until it is protected.
func TestTraceCheckpoint(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c1 := e.start()
	c1.runJob(t, "ring", 3, 1)
	e.takeTrace()
	seq := c1.checkpoint(t, "ring", 1)
	golden(t, "checkpoint", e.takeTrace())
	for r := range 3 {
		holders := 0
		for _, n := range e.mc.Nodes() {
			if e.mc.HasImage(n, fmt.Sprintf("ring.%d", r), seq) {
				holders++
			}
		}
		if holders != 2 {
			t.Errorf("rank %d's image of checkpoint %d is on %d nodes, want 2", r, seq, holders)
		}
	}
}

// TestTraceRestartAfterNodeLoss: a node of a job with one replica per
// image dies; the job restarts by itself from its checkpoint, the lost
// rank on the node that holds its replica, the others where they were,
// and the lost copies are made again (on the spare among others).
func TestTraceRestartAfterNodeLoss(t *testing.T) {
	e := newMemEnv(t, 4, memagent.Options{}, coord.Options{})
	c1 := e.start()
	if _, err := c1.SetSpare(context.Background(), "n3", true); err != nil {
		t.Fatal(err)
	}
	c1.runJob(t, "ring", 3, 1)
	seq := c1.checkpoint(t, "ring", 1)
	e.takeTrace()
	e.mc.Kill("n1")
	var j *coordv1.Job
	waitFor(t, 15*time.Second, "restart after n1 died", func() bool {
		j = e.settled(c1, "ring", 15*time.Second)
		return j.Restarts == 1
	})
	if err := e.consistent(j, seq); err != nil {
		t.Fatal(err)
	}
	if j.RestoredFrom != seq || j.Placement[1] != "n2" {
		t.Fatalf("job restored from %d onto %v, want %d with rank 1 on n2 (its replica's node)", j.RestoredFrom, j.Placement, seq)
	}
	// The repair makes a second copy of rank 1's image again (n1's is
	// gone) and of any other rank's whose replica was on n1.
	waitFor(t, 10*time.Second, "checkpoint protected again", func() bool {
		cks, err := c1.Checkpoints(context.Background(), "ring")
		return err == nil && cks[0].State == coordv1.CkptProtected
	})
	cks, _ := c1.Checkpoints(context.Background(), "ring")
	for _, r := range cks[0].Ranks {
		live := 0
		for _, n := range r.Copies {
			if n == "n1" {
				continue // dead, and its store with it
			}
			live++
			if !e.mc.HasImage(n, fmt.Sprintf("ring.%d", r.Rank), seq) {
				t.Errorf("the catalog says %s holds rank %d's image; it does not", n, r.Rank)
			}
		}
		if live != 2 {
			t.Errorf("rank %d's image has %d live copies (%v), want 2", r.Rank, live, r.Copies)
		}
	}
	// The repair runs beside the restart: its fetches are checked above,
	// and left out of the trace, where they would come in any order.
	var trace []string
	for _, l := range e.takeTrace() {
		if !strings.HasPrefix(l, "  c1 fetch ") {
			trace = append(trace, l)
		}
	}
	golden(t, "restart_node_lost", trace)
}

// TestTraceMigration: rank 1 moves to the spare while the others wait.
func TestTraceMigration(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c1 := e.start()
	c1.runJob(t, "ring", 3, 0, "n0", "n1")
	e.takeTrace()
	m, err := c1.Migrate(context.Background(), "ring", coordv1.Migrate{Rank: 1, To: "n2"})
	if err != nil || m.State != coordv1.MigrationDone {
		t.Fatalf("migrate: %+v %v", m, err)
	}
	golden(t, "migration", e.takeTrace())
	j := e.settled(c1, "ring", time.Second)
	if err := e.consistent(j, 0); err != nil {
		t.Fatal(err)
	}
	if j.Placement[1] != "n2" || j.Migrations != 1 {
		t.Fatalf("placement %v, %d migrations", j.Placement, j.Migrations)
	}
}

// TestMigrationOffASharedNode: rank 1 leaves the node where rank 0 stays.
// That node's job network may point at rank 1's new node only once rank
// 1's copy is gone from it: its agent refuses to take as remote a rank
// still attached to it, and a migration that asked too early was
// recorded done with that refusal in its reason, the node's network left
// without a way to the moved rank. Calls are delayed at random, so that
// some reach their nodes out of the order they were sent in.
func TestMigrationOffASharedNode(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			e := newMemEnv(t, 2, memagent.Options{Seed: seed, Delay: 20 * time.Millisecond}, coord.Options{})
			c1 := e.start()
			c1.runJob(t, "ring", 2, 0, "n0")
			m, err := c1.Migrate(context.Background(), "ring", coordv1.Migrate{Rank: 1, To: "n1"})
			if err != nil || m.State != coordv1.MigrationDone || m.Reason != "" {
				t.Fatalf("migrate off a node another rank stays on: %+v %v", m, err)
			}
			j := e.settled(c1, "ring", time.Second)
			if err := e.consistent(j, 0); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTraceMigrationFails: the target cannot take the rank: the migration
// is undone and the job runs where it was.
func TestTraceMigrationFails(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c1 := e.start()
	c1.runJob(t, "ring", 2, 0, "n0", "n1")
	e.takeTrace()
	e.mc.Partition("n1", "n2") // the target cannot pull the image
	m, err := c1.Migrate(context.Background(), "ring", coordv1.Migrate{Rank: 1, To: "n2"})
	if err == nil || m == nil || m.State != coordv1.MigrationFailed {
		t.Fatalf("migrate across a partition: %+v %v", m, err)
	}
	golden(t, "migration_fails", e.takeTrace())
	j := e.settled(c1, "ring", time.Second)
	if err := e.consistent(j, 0); err != nil {
		t.Fatal(err)
	}
}

// TestTraceRestartDamagedCopy: the copy a restart restores from is found
// damaged: it is mended from the replica and the restore tried again.
func TestTraceRestartDamagedCopy(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c1 := e.start()
	c1.runJob(t, "ring", 2, 1, "n0", "n1")
	seq := c1.checkpoint(t, "ring", 1)
	e.mc.Damage("n0", "ring.0", seq)
	e.takeTrace()
	j, err := c1.Restart(context.Background(), "ring", coordv1.Restart{})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "restart_damaged_copy", e.takeTrace())
	if err := e.consistent(j, seq); err != nil {
		t.Fatal(err)
	}
}

// TestJobSubnets: every job gets a subnet of its own, large enough for
// its ranks, aligned on its size, never overlapping another's.
func TestJobSubnets(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c1 := e.start()
	want := map[string]string{"a": "10.224.0.0/24", "b": "10.224.2.0/23", "c": "10.224.4.0/24", "d": "10.224.8.0/22"}
	for _, job := range []struct {
		name  string
		ranks int
	}{{"a", 2}, {"b", 300}, {"c", 253}, {"d", 600}} {
		j := c1.runJob(t, job.name, job.ranks, 0)
		if j.Subnet != want[job.name] || len(j.Addrs) != job.ranks {
			t.Errorf("job %s of %d ranks: subnet %s, %d addresses; want %s", job.name, job.ranks, j.Subnet, len(j.Addrs), want[job.name])
		}
		p := netip.MustParsePrefix(j.Subnet)
		last := netip.MustParseAddr(j.Addrs[len(j.Addrs)-1])
		if !p.Contains(last) || !p.Contains(last.Next()) {
			t.Errorf("job %s: its last rank's address %s is not inside %s, below its broadcast address", job.name, last, j.Subnet)
		}
	}
	if _, err := c1.RunJob(context.Background(), coordv1.RunJob{Name: "e", Ranks: coord.MaxRanks + 1, Args: []string{"x"}}); err == nil {
		t.Errorf("a job of %d ranks was accepted", coord.MaxRanks+1)
	}
}
