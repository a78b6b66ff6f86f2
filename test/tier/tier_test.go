package tier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/store/tier"
	"github.com/cairn-hpc/cairn/internal/testutil"
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
// (SeaweedFS) as the tier, lazily: the job flushed from one cluster, whose
// agents have the store's endpoint and keys in their environment,
// restarts on a fresh cluster from the bucket alone with --lazy, its
// ranks' memory read from the bucket as they run, and ends exactly.
func TestRestartFromS3OnFreshCluster(t *testing.T) {
	a := testutil.NewCluster(t, 2)
	s3, url := bucketFor(t, a)
	flushTwice(t, a, url)
	// A node reaches only its own cluster's gateway: the server moves
	// there, its data kept, and the new cluster's agents get its address.
	b := testutil.NewCluster(t, 2)
	s3.Rebind(b.Gateway())
	for _, n := range b.Nodes {
		b.RestartAgent(n, s3.Env()...)
	}
	b.OK("restart", "ring", "--from", url, "--lazy")
	// Lazily: each rank's pages are read from the bucket while it runs;
	// no node fetches an image first.
	placed := b.Status("ring").Placement
	for r, n := range placed {
		b.WaitAgentLog(n, fmt.Sprintf(`msg="lazy restore: read from the durable tier" ckpt=ring.%d:2`, r), time.Minute)
	}
	for _, n := range b.Nodes {
		if log := b.AgentLog(n); strings.Contains(log, "fetched from the durable tier") || strings.Contains(log, "lazy restore failed") {
			t.Fatalf("%s's agent fetched an image or failed its lazy restore:\n%s", n, log)
		}
	}
	for r, n := range placed {
		m := regexp.MustCompile(fmt.Sprintf(`msg="lazy restore: read from the durable tier" ckpt=ring\.%d:2 tier=\S+ bytes=(\d+)`, r)).FindStringSubmatch(b.AgentLog(n))
		if m == nil || m[1] == "0" {
			t.Fatalf("rank %d's lazy restore on %s read nothing from the bucket: %v", r, n, m)
		}
		t.Logf("rank %d's lazy restore on %s read %s bytes from the bucket", r, n, m[1])
	}
	if got, want := b.Result("ring"), ringapp.Expected(2, testutil.RingMessages, 64, 1); got != want {
		t.Fatalf("result %s, want %s (an uninterrupted run's)", got, want)
	}
	b.CheckRestarted("ring", 2, testutil.RingOutput)
}

// bucketFor starts an S3 server on c's gateway with a bucket "ckpts",
// gives c's agents its endpoint and keys, and returns it and the tier's
// URL.
func bucketFor(t *testing.T, c *testutil.Cluster) (*testutil.S3Server, string) {
	s3 := testutil.NewS3ServerOn(t, c.Gateway())
	s3.MakeBucket(t, "ckpts")
	for _, n := range c.Nodes {
		c.RestartAgent(n, s3.Env()...)
	}
	return s3, "s3://ckpts/cairn"
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

// TestRetentionOnNodesAndBucket: a job with --keep 3, each checkpoint
// flushed to a real S3 server (SeaweedFS), takes 10 checkpoints, one of
// them (2) pinned. Then exactly 2, 8, 9 and 10 are listed; each node's
// store holds exactly the manifests and chunks of the images it lists,
// which are only those (each on 2 nodes); the bucket holds exactly their
// records, manifests and chunks, by listing its objects; and each of them
// still restores the job to its exact result.
func TestRetentionOnNodesAndBucket(t *testing.T) {
	const messages = 2 * testutil.RingMessages
	c := testutil.NewCluster(t, 3)
	s3, url := bucketFor(t, c)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1", "--replicas", "1", "--keep", "3",
		"--tier", url, "--flush-every", "1", "--on-failure", "stop"}, c.RingArgs(messages)...)...)
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	for i := 1; i <= 10; i++ {
		c.OK("checkpoint", "ring")
		if i == 2 {
			c.OK("checkpoint", "pin", "ring:2")
		}
	}
	want := []int{2, 8, 9, 10}
	for _, kv := range s3.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	ctx := context.Background()
	b, prefix, err := tier.Open(ctx, coordv1.TierRepo(url, "ring"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
		var listed []int
		for _, ck := range c.Ckpts("ring") {
			listed = append(listed, ck.Seq)
		}
		if !slices.Equal(listed, want) {
			return false, fmt.Sprintf("checkpoints %v listed, want %v", listed, want)
		}
		if msg := nodesHoldExactly(t, c, want); msg != "" {
			return false, msg
		}
		return bucketHoldsExactly(t, c, b, prefix, want)
	})

	for _, seq := range want {
		c.OK("kill", "ring")
		c.OK("restart", "ring", "--from", fmt.Sprint(seq))
		if got, want := c.Result("ring"), ringapp.Expected(2, messages, 64, 1); got != want {
			t.Fatalf("restarted from checkpoint %d: result %s, want %s (an uninterrupted run's)", seq, got, want)
		}
	}
}

// keptImages returns the images of job's checkpoints seqs, by name
// (ring.0:8), each with its manifest, from the nodes' catalogs; and the
// nodes holding each.
func keptImages(t *testing.T, c *testutil.Cluster) (manifests map[string]store.ID, holders map[string][]string) {
	manifests, holders = map[string]store.ID{}, map[string][]string{}
	for _, n := range c.Nodes {
		recs, errs := c.Repo(n).All()
		if len(errs) > 0 {
			t.Fatalf("node %s's catalog: %v", n, errs)
		}
		for _, rec := range recs {
			manifests[rec.Name()] = rec.Manifest
			holders[rec.Name()] = append(holders[rec.Name()], n)
		}
	}
	return manifests, holders
}

// nodesHoldExactly says what is wrong with the nodes' catalogs and stores,
// or "": every image of the checkpoints seqs on 2 nodes, no other image,
// and each store with exactly the manifests and chunks of its images.
func nodesHoldExactly(t *testing.T, c *testutil.Cluster, seqs []int) string {
	ctx := context.Background()
	_, holders := keptImages(t, c)
	var names []string
	for _, seq := range seqs {
		for r := range 2 {
			name := fmt.Sprintf("ring.%d:%d", r, seq)
			names = append(names, name)
			if len(holders[name]) != 2 {
				return fmt.Sprintf("image %s on nodes %v, want 2", name, holders[name])
			}
		}
	}
	for name := range holders {
		if !slices.Contains(names, name) {
			return fmt.Sprintf("nodes %v still hold image %s", holders[name], name)
		}
	}
	for _, n := range c.Nodes {
		repo := c.Repo(n)
		recs, _ := repo.All()
		var mans []store.ID
		chunks := map[store.ID]bool{}
		for _, rec := range recs {
			mans = append(mans, rec.Manifest)
			ids, err := repo.ChunkIDs(ctx, rec.Container, rec.Seq)
			if err != nil {
				t.Fatalf("node %s, %s: %v", n, rec.Name(), err)
			}
			for _, id := range ids {
				chunks[id] = true
			}
		}
		st, err := repo.OpenReader()
		if err != nil {
			t.Fatalf("node %s's store: %v", n, err)
		}
		held, err := st.Manifests(ctx)
		stats := st.Stats()
		st.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !sameIDs(held, mans) {
			return fmt.Sprintf("node %s's store holds %d manifests, its %d images use %d", n, len(held), len(recs), len(mans))
		}
		if stats.Chunks != len(chunks) {
			return fmt.Sprintf("node %s's store holds %d chunks, its images use %d", n, stats.Chunks, len(chunks))
		}
	}
	return ""
}

// bucketHoldsExactly says whether the job's repo in the bucket holds
// exactly the records of seqs, their images' manifests, and their chunks
// once each, listing the bucket's objects.
func bucketHoldsExactly(t *testing.T, c *testutil.Cluster, b tier.Bucket, prefix string, seqs []int) (bool, string) {
	ctx := context.Background()
	repo, err := tier.OpenRepo(ctx, b, prefix)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := repo.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(recs, seqs) {
		return false, fmt.Sprintf("the bucket holds the records of checkpoints %v, want %v", recs, seqs)
	}
	manifests, _ := keptImages(t, c)
	var mans []store.ID
	chunks := map[store.ID]bool{}
	for _, m := range manifests {
		mans = append(mans, m)
		man, err := repo.LoadManifest(ctx, m)
		if err != nil {
			return false, fmt.Sprintf("the bucket lacks manifest %s: %v", m.Short(), err)
		}
		for _, id := range man.ChunkIDs() {
			chunks[id] = true
		}
	}
	held, err := repo.Manifests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !sameIDs(held, mans) {
		return false, fmt.Sprintf("the bucket holds %d manifests, the kept images %d", len(held), len(mans))
	}
	ids, n, err := repo.Listing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Two ranks' images share chunks (the same program's pages), and their
	// nodes flush them at once: both may upload one the bucket lacks.
	// Only the copy the index lists is read; the next prune drops the
	// other. The chunks themselves are exactly the kept ones.
	if len(ids) != len(chunks) {
		return false, fmt.Sprintf("the bucket's packs hold %d distinct chunks, the kept images use %d", len(ids), len(chunks))
	}
	for _, id := range ids {
		if !chunks[id] {
			return false, fmt.Sprintf("the bucket holds chunk %s, which no kept image uses", id.Short())
		}
	}
	t.Logf("the bucket holds exactly %d records, %d manifests, %d chunks (%d of them twice, from the last flush)", len(recs), len(held), len(ids), n-len(ids))
	return true, ""
}

// sameIDs says whether a and b hold the same ids, whatever their order.
func sameIDs(a, b []store.ID) bool {
	cmp := func(x, y store.ID) int { return bytes.Compare(x[:], y[:]) }
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, cmp)
	slices.SortFunc(b, cmp)
	return slices.EqualFunc(a, b, func(x, y store.ID) bool { return x == y })
}

// TestTierRefusals: a flush to a bucket that denies access (a key without
// rights) or does not answer (nothing listens at the endpoint) fails with
// exit 1 and an error that names the cause, and leaves the job's local
// checkpoints as they were; a restart from a bucket whose packs are
// truncated fails with exit 4 (corrupt) and restores nothing.
func TestTierRefusals(t *testing.T) {
	c := testutil.NewCluster(t, 2)
	s3, url := bucketFor(t, c)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1", "--tier", url, "--on-failure", "stop"}, c.RingArgs(testutil.RingMessages)...)...)
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	c.OK("checkpoint", "ring")
	c.WaitProtected("ring", time.Minute)
	before, _ := keptImages(t, c)

	env := func(kv ...string) []string {
		e := s3.Env()
		for _, o := range kv {
			k, _, _ := strings.Cut(o, "=")
			e = slices.DeleteFunc(e, func(x string) bool { return strings.HasPrefix(x, k+"=") })
		}
		return append(e, kv...)
	}
	for _, bad := range []struct {
		what, say string
		env       []string
	}{
		{"a key without rights", "denied access", env("AWS_ACCESS_KEY_ID="+s3.DeniedKey, "AWS_SECRET_ACCESS_KEY="+s3.DeniedSecret)},
		{"no server", "unreachable", env("AWS_ENDPOINT_URL=http://" + c.Gateway() + ":9")},
	} {
		for _, n := range c.Nodes {
			c.RestartAgent(n, bad.env...)
		}
		out, err := c.Run("flush", "ring")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, bad.say) {
			t.Fatalf("flush to a bucket with %s: %v, want exit 1 saying %q:\n%s", bad.what, err, bad.say, out)
		}
		t.Logf("flush to a bucket with %s: %s", bad.what, strings.TrimSpace(out))
		if after, _ := keptImages(t, c); !maps.Equal(after, before) {
			t.Fatalf("after a flush to a bucket with %s, the nodes hold %v, before %v", bad.what, after, before)
		}
		if cks := c.Ckpts("ring"); len(cks) != 1 || !cks[0].Restorable() {
			t.Fatalf("after a flush to a bucket with %s, the checkpoints are %+v", bad.what, cks)
		}
	}
	for _, n := range c.Nodes {
		c.RestartAgent(n, s3.Env()...)
	}
	flush(t, c, "ring")

	// Every pack of the bucket cut to half its length: a restart from it
	// restores nothing.
	cl, err := s3.Client(s3.AccessKey, s3.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	packs := 0
	for o := range cl.ListObjects(ctx, "ckpts", minio.ListObjectsOptions{Prefix: "cairn/ring/packs/", Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		obj, err := cl.GetObject(ctx, "ckpts", o.Key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(obj)
		obj.Close()
		if err != nil {
			t.Fatal(err)
		}
		half := data[:len(data)/2]
		if _, err := cl.PutObject(ctx, "ckpts", o.Key, bytes.NewReader(half), int64(len(half)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		packs++
	}
	if packs == 0 {
		t.Fatal("the bucket holds no pack")
	}
	c.OK("rm", "-f", "ring")
	wantExit(t, c, 4, "restart", "ring", "--from", url)
}
