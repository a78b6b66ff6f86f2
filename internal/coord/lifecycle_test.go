package coord_test

import (
	"context"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
	"github.com/cairn-hpc/cairn/internal/events"
)

// TestJobLifecycle: a job whose ranks all exit 0 is exited; one a rank of
// which exits otherwise is failed once every rank has ended, or at once
// with --kill-on-bad-exit (its other ranks killed); a job some of whose
// ranks still run stays running. Each end is an event, with how each
// rank ended.
func TestJobLifecycle(t *testing.T) {
	e := newMemEnv(t, 2, memagent.Options{}, coord.Options{})
	c := e.start()
	ctx := context.Background()
	ends := c.Events().SubscribeNew(events.Filter{Type: "job.*"}, 64)
	exit := func(j *coordv1.Job, rank, code int) {
		t.Helper()
		if !e.mc.Node(j.Placement[rank]).Exit(agentv1.RankName(j.Name, rank), code) {
			t.Fatalf("no rank %d of %s on %s", rank, j.Name, j.Placement[rank])
		}
	}
	jobOf := func(job string) *coordv1.Job {
		t.Helper()
		st, err := c.Status(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		return &st.Job
	}
	ended := func(job string, state coordv1.JobState) *coordv1.Job {
		t.Helper()
		var j *coordv1.Job
		waitFor(t, 10*time.Second, job+" "+string(state), func() bool {
			j = jobOf(job)
			return j.State == state
		})
		return j
	}
	event := func(typ, job string) evv1.Event {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for {
			ev, ok := ends.Wait(wctx)
			if !ok {
				t.Fatalf("no %s event for %s", typ, job)
			}
			if ev.Type == typ && ev.Job == job {
				return ev
			}
		}
	}

	ok := c.runJob(t, "ok", 2, 0, "n0", "n1")
	bad := c.runJob(t, "bad", 2, 0, "n0", "n1")
	half := c.runJob(t, "half", 2, 0, "n0", "n1")
	j, err := c.RunJob(ctx, coordv1.RunJob{Name: "strict", Ranks: 2, Args: []string{"/bin/ring"}, Nodes: []string{"n0", "n1"}, KillOnBadExit: true})
	if err != nil {
		t.Fatal(err)
	}
	strict := j

	exit(ok, 0, 0)
	exit(ok, 1, 0)
	ended("ok", coordv1.JobExited)
	if ev := event(evv1.JobExited, "ok"); ev.Message != "every rank exited 0" {
		t.Errorf("job.exited says %q", ev.Message)
	}

	exit(bad, 1, 7)
	exit(half, 0, 0)
	time.Sleep(3 * memTTL / 4) // a few heartbeats: bad's rank 0 runs on
	if j := jobOf("bad"); j.State != coordv1.JobRunning {
		t.Fatalf("bad with rank 0 running is %s, want running", j.State)
	}
	exit(bad, 0, 0)
	if j := ended("bad", coordv1.JobFailed); j.Reason != "rank 1 exited 7" {
		t.Errorf("bad failed for %q", j.Reason)
	}
	if ev := event(evv1.JobFailed, "bad"); ev.Message != "rank 1 exited 7" {
		t.Errorf("job.failed says %q", ev.Message)
	}

	exit(strict, 0, 3)
	j = ended("strict", coordv1.JobFailed)
	if !strings.HasPrefix(j.Reason, "rank 0 exited 3; the other 1 ranks killed") {
		t.Errorf("strict failed for %q", j.Reason)
	}
	st, err := c.Status(ctx, "strict")
	if err != nil {
		t.Fatal(err)
	}
	if r := st.RankStates[1]; r.Status != agentv1.StatusExited || r.ExitCode == nil || *r.ExitCode != 137 {
		t.Errorf("strict's rank 1 after the bad exit: %s, exit %v; want killed", r.Status, r.ExitCode)
	}

	if j := jobOf("half"); j.State != coordv1.JobRunning {
		t.Errorf("half, one rank running, is %s", j.State)
	}
}

// TestRestartGivesUp: an automatic restart that cannot be done (its ranks
// no longer fit the live nodes) is tried five times; then the job is
// failed with the reason, and job.restart_failed says so. It used to stay
// running, and nothing was published.
func TestRestartGivesUp(t *testing.T) {
	e := newMemEnv(t, 2, memagent.Options{}, coord.Options{})
	c := e.start()
	ctx := context.Background()
	gaveUp := c.Events().SubscribeNew(events.Filter{Type: evv1.JobRestartFailed}, 16)
	if _, err := c.RunJob(ctx, coordv1.RunJob{Name: "ring", Ranks: 2, PerNode: 1, Replicas: 1, Args: []string{"/bin/ring"}}); err != nil {
		t.Fatal(err)
	}
	c.checkpoint(t, "ring", 1)
	e.mc.Kill("n1")
	var j *coordv1.Job
	waitFor(t, 30*time.Second, "the restart to give up", func() bool {
		jobs, err := c.Jobs(ctx)
		if err != nil || len(jobs) != 1 {
			return false
		}
		j = &jobs[0]
		return j.State == coordv1.JobFailed
	})
	if !strings.HasPrefix(j.Reason, "automatic restart gave up: ") || !strings.Contains(j.Reason, "per node") {
		t.Errorf("failed for %q", j.Reason)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if ev, ok := gaveUp.Wait(wctx); !ok || ev.Job != "ring" || ev.Message != j.Reason {
		t.Errorf("job.restart_failed: %+v (%v), want the reason %q", ev, ok, j.Reason)
	}
}

// TestRestartRetriedAfterFailure: an automatic restart that failed onto
// nodes that are all alive (it could not reach one, cut off for a while)
// is tried again, and restarts the job: the retry is not taken for a
// restart that some other one already did. It left the job failed, its
// placement the failed attempt's, before.
func TestRestartRetriedAfterFailure(t *testing.T) {
	e := newMemEnv(t, 4, memagent.Options{}, coord.Options{})
	c := e.start()
	ctx := context.Background()
	if _, err := c.RunJob(ctx, coordv1.RunJob{Name: "ring", Ranks: 2, PerNode: 1, Replicas: 1, Args: []string{"/bin/ring"}, Nodes: []string{"n0", "n1"}}); err != nil {
		t.Fatal(err)
	}
	seq := c.checkpoint(t, "ring", 1)
	// n1 stays alive (its heartbeats reach the coordinator) but the
	// coordinator's calls to it fail: the restart after n0's loss fails.
	e.mc.Partition("c1", "n1")
	e.mc.Kill("n0")
	job := func() coordv1.Job {
		jobs, err := c.Jobs(ctx)
		if err != nil || len(jobs) != 1 {
			t.Fatalf("jobs: %+v %v", jobs, err)
		}
		return jobs[0]
	}
	waitFor(t, 15*time.Second, "the first restart to fail", func() bool {
		j := job()
		return j.State == coordv1.JobFailed && j.Restarts == 0
	})
	e.mc.Heal("c1", "n1")
	var j coordv1.Job
	waitFor(t, 15*time.Second, "the job to restart", func() bool {
		j = job()
		return j.State == coordv1.JobRunning && j.Restarts == 1
	})
	if err := e.consistent(&j, seq); err != nil {
		t.Fatal(err)
	}
}
