package ops

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestMetrics: the ring (3 ranks, one replica of every image) on 4 nodes
// is checkpointed twice, one rank migrates, and the node of another dies
// with its disk, so the job restarts by itself and the lost copies are
// made again. Then the coordinator's and an agent's /metrics, scraped
// with the cluster's client credentials (as curl does), say what `cairn
// events --json` reported: the checkpoints, their bytes and stalls, the
// copies, the migration, the restart, the node lost. A scrape without a
// certificate gets no TLS connection, one with an agent's certificate is
// forbidden at the coordinator, and one over plain HTTP gets no metrics.
func TestMetrics(t *testing.T) {
	// The documented scrape is a curl command: without curl that check
	// cannot run, so the test fails (before it starts a cluster).
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("curl, which this test runs as docs/cluster.md does, is not installed (make setup installs it): %v", err)
	}
	c := testutil.NewCluster(t, 4)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "3", "--per-node", "1", "--replicas", "1"}, c.RingArgs(4_000_000)...)...)
	first := c.Status("ring").Placement
	free := c.Unused(first)
	c.WaitProgress("ring", 3, 0, 60*time.Second)
	for range 2 {
		c.OK("checkpoint", "ring")
		c.WaitProtected("ring", 60*time.Second)
	}
	c.OK("migrate", "ring/0", "--to", free)
	dead := c.Status("ring").Placement[1]
	c.KillNodes([]string{dead}, true)
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		j := c.Job("ring")
		return j.Restarts == 1 && j.State == "running" && !slices.Contains(j.Placement, dead),
			fmt.Sprintf("job %s on %v, %d restarts (%s)", j.State, j.Placement, j.Restarts, j.Reason)
	})
	// The repair copies what the dead node held again: wait for it, so
	// that no copy is made between the events read and the scrape.
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		for _, ck := range c.Ckpts("ring") {
			if ck.State != "protected" {
				return false, fmt.Sprintf("checkpoint %d is %s after the repair", ck.Seq, ck.State)
			}
		}
		return true, ""
	})

	f := c.File()
	creds := filepath.Join(c.Data, "cluster", "client")
	client := scraper(t, creds, true)
	var alive string
	for _, n := range f.Nodes {
		if n.Name != dead {
			alive = n.Name // a node that holds copies
		}
	}
	agentAddr := ""
	for _, n := range f.Nodes {
		if n.Name == alive {
			agentAddr = n.Addr
		}
	}

	// The coordinator's series against the events (the metrics follow
	// the events a moment later: compare until they agree).
	var failures []string
	testutil.WaitUntil(t, 20*time.Second, func() (bool, string) {
		evs := c.Events()
		got := scrapeOK(t, client, f.Coordinator)
		failures = compareCoordinator(evs, got, dead)
		return len(failures) == 0, "the coordinator's metrics disagree with the events:\n" + strings.Join(failures, "\n")
	})
	t.Logf("coordinator: %d series checked against %d events", len(coordinatorWant(c.Events(), dead)), len(c.Events()))

	// An agent's: its store holds at least the copies the catalog gives
	// it, and its probes pass.
	got := scrapeOK(t, client, agentAddr)
	copies := 0
	for _, ck := range c.Ckpts("ring") {
		for _, r := range ck.Ranks {
			if slices.Contains(r.Copies, alive) {
				copies++
			}
		}
	}
	node := fmt.Sprintf(`{node=%q}`, alive)
	if v := got["cairn_store_images"+node]; int(v) < copies || copies == 0 {
		t.Errorf("agent of %s: cairn_store_images %v, the catalog records %d copies there", alive, v, copies)
	}
	for _, name := range []string{"cairn_store_stored_bytes", "cairn_store_raw_bytes", "cairn_store_logical_bytes", "cairn_store_dedup_ratio",
		"cairn_store_compression_ratio", "cairn_staging_size_bytes", "cairn_data_disk_free_bytes"} {
		if got[name+node] <= 0 {
			t.Errorf("agent of %s: %s = %v, want more than 0", alive, name, got[name+node])
		}
	}
	for _, probe := range []string{"disk", "memory"} {
		if v, ok := got[fmt.Sprintf(`cairn_health_probe_ok{node=%q,probe=%q}`, alive, probe)]; !ok || v != 1 {
			t.Errorf("agent of %s: probe %s: %v %v, want 1", alive, probe, v, ok)
		}
	}
	if _, ok := got["go_goroutines"]; !ok {
		t.Errorf("agent of %s: no go_goroutines", alive)
	}

	// The documented command works.
	out, err := exec.Command(curl, "-sS", "--fail", "--cacert", filepath.Join(creds, "ca.crt"), "--cert", filepath.Join(creds, "node.crt"),
		"--key", filepath.Join(creds, "node.key"), "https://"+f.Coordinator+"/metrics").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `cairn_checkpoints_durable_total{job_name="ring"} 2`) {
		t.Errorf("curl with the client's credentials: %v\n%.2000s", err, out)
	}
	if out, err := exec.Command(curl, "-sS", "--fail", "--cacert", filepath.Join(creds, "ca.crt"), "https://"+f.Coordinator+"/metrics").CombinedOutput(); err == nil {
		t.Errorf("curl without a certificate got the metrics:\n%.500s", out)
	}

	// Refused: no certificate (no TLS connection), an agent's certificate
	// at the coordinator (forbidden), plain HTTP (no metrics).
	anon := scraper(t, creds, false)
	for _, addr := range []string{f.Coordinator, agentAddr} {
		if resp, err := anon.Get("https://" + addr + "/metrics"); err == nil {
			resp.Body.Close()
			t.Errorf("%s: a scrape without a certificate got HTTP %d, want no TLS connection", addr, resp.StatusCode)
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || strings.Contains(string(b), "cairn_") {
				t.Errorf("%s: plain HTTP got HTTP %d:\n%.500s", addr, resp.StatusCode, b)
			}
		}
	}
	agentClient := scraper(t, filepath.Join(c.Data, "cluster", "nodes", alive, "creds"), true)
	if resp, err := agentClient.Get("https://" + f.Coordinator + "/metrics"); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("an agent's certificate at the coordinator: %v %v, want 403", resp, err)
	} else {
		resp.Body.Close()
	}
}

// coordinatorWant is what the coordinator's series must be, given the
// events.
func coordinatorWant(evs []evv1.Event, dead string) map[string]float64 {
	want := map[string]float64{`etcd_server_has_leader`: 1, `cairn_replication_lag_seconds{job_name="ring"}`: 0}
	var newest evv1.Event
	add := func(k string, v float64) { want[k] += v }
	for _, e := range evs {
		switch {
		case e.Type == evv1.NodeLost:
			add(fmt.Sprintf(`cairn_node_lost_total{node=%q}`, e.Node), 1)
		case e.Job != "ring":
		case e.Type == evv1.CkptDurable:
			add(`cairn_checkpoints_durable_total{job_name="ring"}`, 1)
			add(`cairn_checkpoint_image_bytes_total{job_name="ring"}`, float64(e.Bytes))
			add(`cairn_checkpoint_stall_seconds_count{job_name="ring"}`, 1)
			add(`cairn_checkpoint_stall_seconds_sum{job_name="ring"}`, e.Duration.Seconds())
			if e.Ckpt > newest.Ckpt {
				newest = e
			}
		case e.Type == evv1.CkptProtected:
			add(`cairn_checkpoints_protected_total{job_name="ring"}`, 1)
		case e.Type == evv1.ReplicaCopied:
			add(`cairn_replica_copies_total{job_name="ring"}`, 1)
			add(`cairn_replica_copied_bytes_total{job_name="ring"}`, float64(e.Bytes))
		case e.Type == evv1.JobRestarted:
			add(`cairn_job_restarts_total{job_name="ring"}`, 1)
		case e.Type == evv1.MigrationDone:
			add(`cairn_migrations_total{job_name="ring",result="done"}`, 1)
			add(`cairn_migration_moved_bytes_total{job_name="ring"}`, float64(e.Bytes))
			add(`cairn_migration_phase_seconds_count{job_name="ring",phase="move"}`, 1)
		}
	}
	want[`cairn_checkpoint_last_durable_number{job_name="ring"}`] = float64(newest.Ckpt)
	want[`cairn_checkpoint_last_image_bytes{job_name="ring"}`] = float64(newest.Bytes)
	want[`cairn_checkpoint_last_durable_timestamp_seconds{job_name="ring"}`] = float64(newest.Time.UnixNano()) / 1e9
	want[fmt.Sprintf(`cairn_node_alive{node=%q}`, dead)] = 0
	want[`cairn_job_state{job_name="ring",state="running"}`] = 1
	return want
}

// compareCoordinator lists where the coordinator's series (got) differ
// from what the events say, and checks the facts of the story itself.
func compareCoordinator(evs []evv1.Event, got map[string]float64, dead string) []string {
	want := coordinatorWant(evs, dead)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		v, ok := got[k]
		tol := 1e-6
		if strings.Contains(k, "timestamp") {
			tol = 1e-3
		}
		if !ok || math.Abs(v-want[k]) > tol*math.Max(1, math.Abs(want[k])) {
			out = append(out, fmt.Sprintf("  %s = %v (%v), events say %v", k, v, ok, want[k]))
		}
	}
	for k, min := range map[string]float64{
		`cairn_checkpoints_durable_total{job_name="ring"}`:                   2,
		`cairn_replica_copies_total{job_name="ring"}`:                        6,
		`cairn_job_restarts_total{job_name="ring"}`:                          1,
		`cairn_migrations_total{job_name="ring",result="done"}`:              1,
		`cairn_checkpoint_last_image_bytes{job_name="ring"}`:                 1,
		`cairn_checkpoint_last_protected_timestamp_seconds{job_name="ring"}`: 1,
	} {
		if got[k] < min {
			out = append(out, fmt.Sprintf("  %s = %v, want at least %v", k, got[k], min))
		}
	}
	// The newest checkpoint's ranks add up to its bytes.
	var ranks float64
	for r := range 3 {
		ranks += got[fmt.Sprintf(`cairn_rank_checkpoint_image_bytes{job_name="ring",rank="%d"}`, r)]
	}
	if ranks != want[`cairn_checkpoint_last_image_bytes{job_name="ring"}`] {
		out = append(out, fmt.Sprintf("  the ranks' image bytes add up to %v, the newest checkpoint's are %v", ranks, want[`cairn_checkpoint_last_image_bytes{job_name="ring"}`]))
	}
	return out
}

// scraper is an HTTPS client that verifies servers with the ca.crt in
// dir and, with cert, presents node.crt and node.key from it, as curl
// --cacert --cert --key does.
func scraper(t *testing.T, dir string, cert bool) *http.Client {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("no CA certificate in ca.crt")
	}
	conf := &tls.Config{RootCAs: pool}
	if cert {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key"))
		if err != nil {
			t.Fatal(err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 20 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// scrapeOK GETs https://addr/metrics and returns its series by name and
// labels, as written.
func scrapeOK(t *testing.T, hc *http.Client, addr string) map[string]float64 {
	t.Helper()
	resp, err := hc.Get("https://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape %s: HTTP %d: %s", addr, resp.StatusCode, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape %s: line %q: %v", addr, line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return out
}
