package coord_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
	"github.com/cairn-hpc/cairn/internal/events"
)

// TestRankRequests: an agent asks for its own ranks only; a rank's
// checkpoint is a global one of its job; its events are rate-limited.
func TestRankRequests(t *testing.T) {
	e := newMemEnv(t, 2, memagent.Options{}, coord.Options{})
	c := e.start()
	ctx := context.Background()
	j := c.runJob(t, "ring", 2, 0, "n0", "n1")
	mine := coordv1.RankRequest{Job: "ring", Rank: 1}
	node := j.Placement[1]
	other := j.Placement[0]

	if _, err := c.RankCheckpoint(ctx, other, mine); !isCode(err, agentv1.CodeForbidden) {
		t.Fatalf("a checkpoint asked by the agent of another rank's node: %v", err)
	}
	if _, err := c.RankInfo(ctx, node, coordv1.RankRequest{Job: "ring", Rank: 7}); !isCode(err, agentv1.CodeForbidden) {
		t.Fatalf("info of a rank the job does not have: %v", err)
	}
	ck, err := c.RankCheckpoint(ctx, node, mine)
	if err != nil || ck.Seq != 1 || ck.State != coordv1.CkptDurable {
		t.Fatalf("checkpoint asked by rank 1: %+v %v", ck, err)
	}
	info, err := c.RankInfo(ctx, node, mine)
	if err != nil || info.Ckpt != 1 || info.Mode != coordv1.ModeTransparent {
		t.Fatalf("info: %+v %v", info, err)
	}

	sub := c.Events().SubscribeNew(events.Filter{Type: evv1.RankEvent}, 64)
	defer sub.Cancel()
	// Events as fast as they go, until one is refused: no more than the
	// burst (20), plus what the rate (10 a second) gave back meanwhile,
	// gets through.
	const burst, perSecond = 20, 10
	start, allowed := time.Now(), 0
	for {
		err := c.RankEvent(ctx, node, coordv1.RankRequest{Job: "ring", Rank: 1, Kind: "step", Message: "n"})
		if isCode(err, coordv1.CodeRateLimited) {
			break
		}
		if err != nil {
			t.Fatalf("event %d: %v", allowed, err)
		}
		if allowed++; allowed > 200 {
			t.Fatal("200 events at once were all taken")
		}
	}
	if most := burst + int(perSecond*time.Since(start).Seconds()) + 1; allowed < burst || allowed > most {
		t.Fatalf("%d events at once taken in %v before one was refused, want %d to %d", allowed, time.Since(start), burst, most)
	}
	ev, ok := sub.Wait(ctx)
	if !ok || ev.Job != "ring" || ev.Rank == nil || *ev.Rank != 1 || ev.Kind != "step" || ev.Message != "n" {
		t.Fatalf("the rank's event on the stream: %+v", ev)
	}

	// Stop: the job is stopped at the checkpoint.
	if _, err := c.RankCheckpoint(ctx, node, coordv1.RankRequest{Job: "ring", Rank: 1, Stop: true}); err != nil {
		t.Fatal(err)
	}
	j2, err := c.Status(ctx, "ring")
	if err != nil || j2.State != coordv1.JobStopped {
		t.Fatalf("after checkpoint-and-stop the job is %v (%v)", j2.State, err)
	}
}

func isCode(err error, code string) bool {
	var we *agentv1.Error
	return errors.As(err, &we) && we.Code == code
}

// TestRankAsksManyTimes: 40 checkpoints asked at once by a job's ranks
// make at most two rounds (one that runs, one that all later asks join),
// every ask answered with a durable checkpoint taken after it.
func TestRankAsksManyTimes(t *testing.T) {
	e := newMemEnv(t, 2, memagent.Options{Delay: 5 * time.Millisecond}, coord.Options{})
	c := e.start()
	j := c.runJob(t, "ring", 2, 0, "n0", "n1")
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Go(func() {
			ck, err := c.RankCheckpoint(context.Background(), j.Placement[i%2], coordv1.RankRequest{Job: "ring", Rank: i % 2})
			if err == nil && ck.State != coordv1.CkptDurable {
				err = fmt.Errorf("checkpoint %d is %s", ck.Seq, ck.State)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	cks, err := c.Checkpoints(context.Background(), "ring")
	if err != nil {
		t.Fatal(err)
	}
	if len(cks) < 1 || len(cks) > 2 {
		t.Fatalf("40 asks at once made %d rounds, want 1 or 2", len(cks))
	}
}

// TestKillDropsAskedRound: a kill waits for the round that runs, not for
// one its ranks asked for that waits behind it: that one never starts,
// and its askers are told why.
func TestKillDropsAskedRound(t *testing.T) {
	e := newMemEnv(t, 2, memagent.Options{Delay: 100 * time.Millisecond}, coord.Options{})
	c := e.start()
	ctx := context.Background()
	j := c.runJob(t, "ring", 2, 0, "n0", "n1")
	ask := func() chan error {
		errc := make(chan error, 1)
		go func() {
			_, err := c.RankCheckpoint(ctx, j.Placement[0], coordv1.RankRequest{Job: "ring", Rank: 0})
			errc <- err
		}()
		return errc
	}
	first := ask()
	waitFor(t, 10*time.Second, "the first round to start", func() bool {
		cks, _ := c.Checkpoints(ctx, "ring")
		return len(cks) == 1
	})
	second := ask()
	time.Sleep(50 * time.Millisecond) // the second ask waits behind the first round
	if _, err := c.KillJob(ctx, "ring", 0); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Errorf("the round that ran: %v", err)
	}
	if err := <-second; !isCode(err, coordv1.CodeConflict) || !strings.Contains(err.Error(), "killed") {
		t.Errorf("the ask that waited: %v, want it dropped by the kill", err)
	}
	if cks, _ := c.Checkpoints(ctx, "ring"); len(cks) != 1 {
		t.Errorf("%d rounds, want only the one that ran before the kill", len(cks))
	}
}
