package coord_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

const testTier = "s3://bucket/jobs"

// TestFlushAndRestartFromTier: a flushed checkpoint restarts a job the
// cluster no longer knows (removed with every image, as a new allocation
// would not know it) from the tier alone: same addresses, restored from
// that checkpoint, flushing to the same tier again. A second flush of the
// same checkpoint uploads nothing new.
func TestFlushAndRestartFromTier(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c := e.start()
	e.last = c
	j, err := c.RunJob(context.Background(), coordv1.RunJob{Name: "ring", Ranks: 3, Args: []string{"/bin/ring"}, Tier: testTier})
	if err != nil {
		t.Fatal(err)
	}
	c.checkpoint(t, "ring", 0)
	seq := c.checkpoint(t, "ring", 0)
	ck, err := c.Flush(context.Background(), "ring", coordv1.Flush{})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Seq != seq || ck.Flushed == nil || ck.Flushed.URL != testTier || len(ck.Flushed.Manifests) != 3 || ck.Flushed.NewChunks == 0 {
		t.Fatalf("flush: %+v (flushed %+v), want checkpoint %d flushed to %s with 3 manifests", ck, ck.Flushed, seq, testTier)
	}
	repo := testTier + "/ring"
	if got := e.mc.TierRecords(repo); !slices.Equal(got, []int{seq}) {
		t.Errorf("tier records %v, want [%d]", got, seq)
	}
	again, err := c.Flush(context.Background(), "ring", coordv1.Flush{Seq: seq})
	if err != nil || again.Flushed.NewChunks != 0 {
		t.Errorf("second flush: %+v %v, want nothing new", again.Flushed, err)
	}
	// The record names the job and every rank's image.
	var rec coordv1.TierCkpt
	data := tierRecord(t, e, repo, seq)
	if err := json.Unmarshal(data, &rec); err != nil || rec.Job.Name != "ring" || rec.Ckpt.Seq != seq || len(rec.Images) != 3 {
		t.Fatalf("tier record: %+v %v", rec, err)
	}

	if _, err := c.RemoveJob(context.Background(), "ring", true); err != nil {
		t.Fatal(err)
	}
	for _, n := range e.mc.Nodes() {
		for r := range 3 {
			if e.mc.HasImage(n, fmt.Sprintf("ring.%d", r), seq) {
				t.Fatalf("%s still holds rank %d's image after rm -f", n, r)
			}
		}
	}
	got, err := c.Restart(context.Background(), "ring", coordv1.Restart{Tier: testTier})
	if err != nil {
		t.Fatal(err)
	}
	if got.RestoredFrom != seq || !slices.Equal(got.Addrs, j.Addrs) || got.Tier != testTier {
		t.Errorf("restarted from the tier: restored from %d at %v (tier %q), want %d at %v (%s)", got.RestoredFrom, got.Addrs, got.Tier, seq, j.Addrs, testTier)
	}
	if err := e.consistent(e.settled(c, "ring", 10*time.Second), seq); err != nil {
		t.Fatal(err)
	}
	// A cluster that has the job refuses to import it again.
	if _, err := c.Restart(context.Background(), "ring", coordv1.Restart{Tier: testTier}); !isCode(err, agentv1.CodeExists) {
		t.Errorf("restart from the tier of a job the cluster has: %v, want exists", err)
	}
	// The job goes on: its next checkpoints are numbered after it.
	if next := c.checkpoint(t, "ring", 0); next <= seq {
		t.Errorf("checkpoint after the restart numbered %d, want more than %d", next, seq)
	}
}

// tierRecord reads record seq of the tier at repo through a node.
func tierRecord(t *testing.T, e *memEnv, repo string, seq int) []byte {
	t.Helper()
	out, err := e.mc.Client("test", "n0").TierRead(context.Background(), agentv1.TierRead{URL: repo, Seq: seq})
	if err != nil {
		t.Fatal(err)
	}
	return out.Data
}

// TestRestartFromTierRefuses: a tier that is unreachable, an image that
// is damaged there, and a record that was tampered with each fail the
// restart with the error that says so; the cluster is left without the
// job, so that the restart can be asked again once the tier is mended,
// and it then succeeds.
func TestRestartFromTierRefuses(t *testing.T) {
	e := newMemEnv(t, 2, memagent.Options{}, coord.Options{})
	c := e.start()
	e.last = c
	c.runJob(t, "ring", 2, 0)
	seq := c.checkpoint(t, "ring", 0)
	if _, err := c.Flush(context.Background(), "ring", coordv1.Flush{Tier: testTier}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemoveJob(context.Background(), "ring", true); err != nil {
		t.Fatal(err)
	}
	repo := testTier + "/ring"
	gone := func(what string) {
		t.Helper()
		if _, err := c.Status(context.Background(), "ring"); !isCode(err, agentv1.CodeNotFound) {
			t.Errorf("after %s, the cluster has job ring: %v", what, err)
		}
	}
	e.mc.TierDown(repo, true)
	if _, err := c.Restart(context.Background(), "ring", coordv1.Restart{Tier: testTier}); !isCode(err, agentv1.CodeTierUnreachable) {
		t.Errorf("restart from a tier that is down: %v, want unreachable", err)
	}
	gone("an unreachable tier")
	e.mc.TierDown(repo, false)
	e.mc.DamageTier(repo, "ring.1", seq)
	if _, err := c.Restart(context.Background(), "ring", coordv1.Restart{Tier: testTier}); !isCode(err, agentv1.CodeCorrupt) {
		t.Errorf("restart from a damaged image: %v, want corrupt", err)
	}
	gone("a damaged image")

	// A record of another job filed as ring's.
	data := tierRecord(t, e, repo, seq)
	tampered := strings.Replace(string(data), `"name":"ring"`, `"name":"other"`, 1)
	if err := e.mc.Client("test", "n0").TierRecord(context.Background(), agentv1.TierRecord{URL: repo, Seq: seq, Data: []byte(tampered)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Restart(context.Background(), "ring", coordv1.Restart{Tier: testTier}); !isCode(err, agentv1.CodeCorrupt) || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("restart from a tampered record: %v, want corrupt", err)
	}
	gone("a tampered record")
	if _, err := c.Restart(context.Background(), "ring", coordv1.Restart{Tier: "s3://user:secret@bucket/jobs"}); !isCode(err, agentv1.CodeBadRequest) || strings.Contains(err.Error(), "secret") {
		t.Errorf("restart from a URL with credentials: %v, want a bad request that does not repeat them", err)
	}
}

// TestRetentionInTier: a job that keeps 3 and flushes every checkpoint
// has, after 10 rounds, exactly its 3 listed checkpoints in the tier.
func TestRetentionInTier(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c := e.start()
	e.last = c
	if _, err := c.RunJob(context.Background(), coordv1.RunJob{Name: "ring", Ranks: 2, Replicas: 1, Keep: 3, Tier: testTier, FlushEvery: 1,
		Args: []string{"/bin/ring"}, Nodes: []string{"n0", "n1"}}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		c.checkpoint(t, "ring", 1)
	}
	repo := testTier + "/ring"
	waitFor(t, 10*time.Second, "3 checkpoints listed and in the tier", func() bool {
		return slices.Equal(listed(t, c), []int{8, 9, 10}) && slices.Equal(e.mc.TierRecords(repo), []int{8, 9, 10}) &&
			len(e.mc.TierImages(repo)) == 6
	})
	holdsExactly(t, e, c, "ring", 10)
	if got, want := e.mc.TierImages(repo), []string{"ring.0:10", "ring.0:8", "ring.0:9", "ring.1:10", "ring.1:8", "ring.1:9"}; !slices.Equal(got, want) {
		t.Errorf("tier holds %v, want %v", got, want)
	}
}

// TestRestartFromTierLazily: a job imported from the tier with --lazy is
// restored from the tier while it runs: no node fetches an image, and the
// catalog lists the checkpoint as held by no node, in the tier only. A
// later restart (eager) restores from the tier again, fetching each image
// to its node, and the catalog then lists those copies.
func TestRestartFromTierLazily(t *testing.T) {
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{})
	c := e.start()
	e.last = c
	ctx := context.Background()
	if _, err := c.RunJob(ctx, coordv1.RunJob{Name: "ring", Ranks: 3, Args: []string{"/bin/ring"}, Tier: testTier}); err != nil {
		t.Fatal(err)
	}
	seq := c.checkpoint(t, "ring", 0)
	if _, err := c.Flush(ctx, "ring", coordv1.Flush{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemoveJob(ctx, "ring", true); err != nil {
		t.Fatal(err)
	}
	fetches := e.mc.Ops()["tier-fetch"]
	if _, err := c.Restart(ctx, "ring", coordv1.Restart{Tier: testTier, Lazy: new(true)}); err != nil {
		t.Fatal(err)
	}
	if err := e.consistent(e.settled(c, "ring", 10*time.Second), seq); err != nil {
		t.Fatal(err)
	}
	if n := e.mc.Ops()["tier-fetch"] - fetches; n != 0 {
		t.Errorf("a lazy restart from the tier fetched %d images", n)
	}
	held := func() map[int][]string {
		t.Helper()
		cks, err := c.Checkpoints(ctx, "ring")
		if err != nil || len(cks) != 1 || cks[0].Seq != seq {
			t.Fatalf("checkpoints %+v %v, want %d alone", cks, err, seq)
		}
		if cks[0].Unavailable != nil {
			t.Errorf("checkpoint %d, in the tier, is listed with ranks %v unavailable", seq, cks[0].Unavailable)
		}
		out := map[int][]string{}
		for _, r := range cks[0].Ranks {
			out[r.Rank] = r.Copies
			for _, n := range e.mc.Nodes() {
				if e.mc.HasImage(n, fmt.Sprintf("ring.%d", r.Rank), seq) != slices.Contains(r.Copies, n) {
					t.Errorf("rank %d: the catalog lists copies on %v; %s holds one: %v", r.Rank, r.Copies, n, !slices.Contains(r.Copies, n))
				}
			}
		}
		return out
	}
	for r, copies := range held() {
		if len(copies) != 0 {
			t.Errorf("after a lazy restart from the tier, rank %d is listed on %v", r, copies)
		}
	}

	// A restart of the job now: from the tier again, eagerly.
	if _, err := c.Restart(ctx, "ring", coordv1.Restart{Lazy: new(false)}); err != nil {
		t.Fatal(err)
	}
	j := e.settled(c, "ring", 10*time.Second)
	if err := e.consistent(j, seq); err != nil {
		t.Fatal(err)
	}
	if n := e.mc.Ops()["tier-fetch"] - fetches; n != 3 {
		t.Errorf("an eager restart from the tier fetched %d images, want 3", n)
	}
	for r, copies := range held() {
		if !slices.Equal(copies, []string{j.Placement[r]}) {
			t.Errorf("after an eager restart from the tier, rank %d is listed on %v, want its node %s", r, copies, j.Placement[r])
		}
	}
}

// TestRestartFromTierAfterCopiesLost: a job whose nodes die with every
// copy of its checkpoint restarts on others from its durable tier, by
// itself.
func TestRestartFromTierAfterCopiesLost(t *testing.T) {
	e := newMemEnv(t, 4, memagent.Options{}, coord.Options{})
	c := e.start()
	e.last = c
	ctx := context.Background()
	if _, err := c.RunJob(ctx, coordv1.RunJob{Name: "ring", Ranks: 2, PerNode: 1, Args: []string{"/bin/ring"}, Nodes: []string{"n0", "n1"}, Tier: testTier}); err != nil {
		t.Fatal(err)
	}
	seq := c.checkpoint(t, "ring", 0)
	if _, err := c.Flush(ctx, "ring", coordv1.Flush{}); err != nil {
		t.Fatal(err)
	}
	e.mc.Kill("n0")
	e.mc.Kill("n1")
	var j *coordv1.Job
	waitFor(t, 30*time.Second, "the job restarted on n2 and n3", func() bool {
		jobs, err := c.Jobs(ctx)
		if err != nil || len(jobs) != 1 {
			return false
		}
		j = &jobs[0]
		return j.State == coordv1.JobRunning && j.Restarts > 0
	})
	if err := e.consistent(j, seq); err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(slices.Values(j.Placement)); !slices.Equal(got, []string{"n2", "n3"}) {
		t.Errorf("restarted on %v, want n2 and n3", j.Placement)
	}
}
