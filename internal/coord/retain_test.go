package coord_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// TestRetention: after 10 rounds of a job that keeps 3, exactly its 3
// newest checkpoints are listed, and a pinned one; every node holds
// exactly their images (own copies and replicas), nothing of the others.
// A user's rm removes one the same way; a pinned one is refused until
// unpinned.
func TestRetention(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c := e.start()
	e.last = c
	if _, err := c.RunJob(context.Background(), coordv1.RunJob{Name: "ring", Ranks: 2, Replicas: 1, Keep: 3, Args: []string{"/bin/ring"}, Nodes: []string{"n0", "n1"}}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		seq := c.checkpoint(t, "ring", 1)
		if seq == 2 {
			if _, err := c.PinCkpt(context.Background(), "ring", 2, coordv1.Pin{Pinned: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []int{2, 8, 9, 10}
	waitFor(t, 10*time.Second, fmt.Sprintf("checkpoints %v listed", want), func() bool {
		return slices.Equal(listed(t, c), want)
	})
	holdsExactly(t, e, c, "ring", 10)

	if _, err := c.RemoveCkpt(context.Background(), "ring", 2); !isCode(err, coordv1.CodeConflict) {
		t.Errorf("rm of a pinned checkpoint: %v, want a conflict", err)
	}
	if _, err := c.PinCkpt(context.Background(), "ring", 2, coordv1.Pin{}); err != nil {
		t.Fatal(err)
	}
	out, err := c.RemoveCkpt(context.Background(), "ring", 2)
	if err != nil || out.Images != 4 {
		t.Fatalf("rm of checkpoint 2: %+v %v, want its 4 images (2 ranks, 2 copies each) dropped", out, err)
	}
	if got := listed(t, c); !slices.Equal(got, []int{8, 9, 10}) {
		t.Errorf("after rm of 2, checkpoints %v listed, want [8 9 10]", got)
	}
	holdsExactly(t, e, c, "ring", 10)
	if _, err := c.RemoveCkpt(context.Background(), "ring", 2); !isCode(err, "not_found") {
		t.Errorf("rm of a removed checkpoint: %v, want not found", err)
	}
	// Each kept one still restores.
	for _, seq := range []int{8, 9, 10} {
		if _, err := c.Restart(context.Background(), "ring", coordv1.Restart{From: seq}); err != nil {
			t.Fatalf("restart from %d: %v", seq, err)
		}
		if err := e.consistent(e.settled(c, "ring", 10*time.Second), seq); err != nil {
			t.Fatal(err)
		}
	}
}

// listed returns the numbers of a job's listed checkpoints.
func listed(t *testing.T, c *memCoord) []int {
	t.Helper()
	cks, err := c.Checkpoints(context.Background(), "ring")
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int
	for _, ck := range cks {
		seqs = append(seqs, ck.Seq)
	}
	return seqs
}

// holdsExactly checks that every node holds the images of job's listed
// checkpoints where their records say, and none of checkpoints 1..upTo
// that are not listed.
func holdsExactly(t *testing.T, e *memEnv, c *memCoord, job string, upTo int) {
	t.Helper()
	cks, err := c.Checkpoints(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	where := map[string]bool{} // node/rank/seq
	for _, ck := range cks {
		for _, r := range ck.Ranks {
			for _, n := range r.Copies {
				where[fmt.Sprintf("%s/%d/%d", n, r.Rank, ck.Seq)] = true
			}
		}
	}
	for _, n := range e.mc.Nodes() {
		for r := range 2 {
			for seq := 1; seq <= upTo; seq++ {
				has := e.mc.HasImage(n, fmt.Sprintf("%s.%d", job, r), seq)
				if want := where[fmt.Sprintf("%s/%d/%d", n, r, seq)]; has != want {
					t.Errorf("node %s holds image %s.%d:%d: %v, want %v", n, job, r, seq, has, want)
				}
			}
		}
	}
}
