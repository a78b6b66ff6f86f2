package tier

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordv1 "cairn/api/coord/v1"
	"cairn/internal/ringapp"
	"cairn/internal/testutil"
)

// TestRestartFromTierOnFreshCluster: a job's checkpoints are flushed from
// one cluster to a shared-file-system tier (the second flush uploads only
// the chunks that changed); the job is stopped at a checkpoint, flushed,
// and restarted from the tier alone on a fresh cluster (new nodes, data
// dirs and CA), where it ends with exactly an uninterrupted run's result.
// Before that, the fresh cluster refuses a tier holding nothing (not
// found, exit 3) and one whose packs are damaged (corrupt, exit 4), and
// keeps no trace of the job either time.
func TestRestartFromTierOnFreshCluster(t *testing.T) {
	dir := t.TempDir()
	url := "file://" + dir
	a := testutil.NewCluster(t, 2)
	flushTwice(t, a, url)

	b := testutil.NewCluster(t, 2)
	// A tier that holds nothing of the job, then one whose packs are
	// damaged.
	wantExit(t, b, 3, "restart", "ring", "--from", "file://"+t.TempDir())
	damaged := t.TempDir()
	if out, err := exec.Command("cp", "-a", dir+"/.", damaged).CombinedOutput(); err != nil {
		t.Fatalf("copy the tier: %v\n%s", err, out)
	}
	packs, _ := filepath.Glob(filepath.Join(damaged, "ring", "packs", "*", "*"))
	if len(packs) == 0 {
		t.Fatal("the tier holds no pack")
	}
	for _, p := range packs {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		data[len(data)/2] ^= 0xff
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	wantExit(t, b, 4, "restart", "ring", "--from", "file://"+damaged)

	b.OK("restart", "ring", "--from", url)
	if st := b.Status("ring"); st.State != "running" {
		t.Fatalf("job %s on the fresh cluster after its restart from the tier", st.State)
	}
	if got, want := b.Result("ring"), ringapp.Expected(2, testutil.RingMessages, 64, 1); got != want {
		t.Fatalf("result %s, want %s (an uninterrupted run's)", got, want)
	}
	b.CheckRestarted("ring", 2, testutil.RingOutput)
}

// TestRestartFromS3OnFreshCluster: the same with a real S3 server
// (SeaweedFS) as the tier: the job flushed from one cluster, whose agents
// have the store's endpoint and keys in their environment, restarts on a
// fresh cluster from the bucket alone and ends exactly.
func TestRestartFromS3OnFreshCluster(t *testing.T) {
	a := testutil.NewCluster(t, 2)
	s3 := testutil.NewS3ServerOn(t, a.Gateway())
	s3.MakeBucket(t, "ckpts")
	for _, n := range a.Nodes {
		a.RestartAgent(n, s3.Env()...)
	}
	url := "s3://ckpts/cairn"
	flushTwice(t, a, url)
	// A node reaches only its own cluster's gateway: the server moves
	// there, its data kept, and the new cluster's agents get its address.
	b := testutil.NewCluster(t, 2)
	s3.Rebind(b.Gateway())
	for _, n := range b.Nodes {
		b.RestartAgent(n, s3.Env()...)
	}
	b.OK("restart", "ring", "--from", url)
	if got, want := b.Result("ring"), ringapp.Expected(2, testutil.RingMessages, 64, 1); got != want {
		t.Fatalf("result %s, want %s (an uninterrupted run's)", got, want)
	}
	b.CheckRestarted("ring", 2, testutil.RingOutput)
}

// flushTwice runs the ring job on c with its tier at url, flushes a first
// checkpoint, then stops the job at a second one and flushes that: the
// second flush must upload only what changed.
func flushTwice(t *testing.T, c *testutil.Cluster, url string) {
	t.Helper()
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1", "--tier", url}, c.RingArgs(testutil.RingMessages)...)...)
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	c.OK("checkpoint", "ring")
	first := flush(t, c, "ring")
	// The ranks' images share chunks (the same program's pages): the
	// first flush to reach the tier uploads them, the other not.
	if first.Seq != 1 || first.Flushed.NewChunks == 0 {
		t.Fatalf("first flush: checkpoint %d, %+v; want checkpoint 1, its chunks uploaded", first.Seq, first.Flushed)
	}
	c.OK("checkpoint", "ring", "--stop")
	second := flush(t, c, "ring")
	f1, f2 := first.Flushed, second.Flushed
	t.Logf("flush to %s of checkpoint 1: %d of %d chunks, %d bytes uploaded; of checkpoint 2: %d of %d chunks, %d bytes",
		url, f1.NewChunks, f1.Chunks, f1.Bytes, f2.NewChunks, f2.Chunks, f2.Bytes)
	if second.Seq != 2 || f2.NewChunks >= f2.Chunks || f2.Bytes >= f1.Bytes {
		t.Fatalf("second flush uploaded %d of %d chunks (%d bytes, the first %d): want only what changed", f2.NewChunks, f2.Chunks, f2.Bytes, f1.Bytes)
	}
}

// flush flushes job's newest checkpoint and returns it.
func flush(t *testing.T, c *testutil.Cluster, job string) coordv1.Ckpt {
	t.Helper()
	var ck coordv1.Ckpt
	if err := json.Unmarshal([]byte(c.OK("flush", job, "--json")), &ck); err != nil {
		t.Fatal(err)
	}
	if ck.Flushed == nil {
		t.Fatalf("flush of %s:%d answered no flush", job, ck.Seq)
	}
	return ck
}

// wantExit runs a cairn command that must fail with exit code code, and
// checks that the cluster then has no job ring.
func wantExit(t *testing.T, c *testutil.Cluster, code int, args ...string) {
	t.Helper()
	out, err := c.Run(args...)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != code {
		t.Fatalf("cairn %s: %v, want exit %d\n%s", strings.Join(args, " "), err, code, out)
	}
	if jobs := c.OK("jobs"); strings.Contains(jobs, "ring") {
		t.Fatalf("after cairn %s failed, the cluster lists the job:\n%s", strings.Join(args, " "), jobs)
	}
}
