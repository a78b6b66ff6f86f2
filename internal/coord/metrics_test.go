package coord_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
	"github.com/cairn-hpc/cairn/internal/events"
	"github.com/cairn-hpc/cairn/internal/metrics"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

const testToken = "0123456789abcdef0123456789abcdef"

// scrape GETs /metrics at addr with creds (nil: no certificate) and the bearer
// token (empty: none).
func scrape(t *testing.T, addr string, creds *pki.Credentials, token string) (int, string, error) {
	t.Helper()
	return get(t, addr, metrics.Path, creds, token)
}

// get GETs path at addr with creds' certificate (nil: none) and token
// (as a bearer token, if set), and returns the status and body.
func get(t *testing.T, addr, path string, creds *pki.Credentials, token string) (int, string, error) {
	t.Helper()
	conf := &tls.Config{InsecureSkipVerify: true}
	if creds != nil {
		conf = pki.ClientConfig(creds, "127.0.0.1")
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequest("GET", "https://"+addr+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestMetricsAccess: clients and the coordinator scrape /metrics with
// their certificates, agents may not; without a certificate there is no
// TLS connection at all, unless a token is set: then the token, and only
// it, allows GET /metrics and nothing else.
func TestMetricsAccess(t *testing.T) {
	for _, withToken := range []bool{false, true} {
		t.Run(fmt.Sprintf("token=%v", withToken), func(t *testing.T) {
			opts := coord.Options{Metrics: metrics.NewCoord(metrics.CoordOptions{})}
			if withToken {
				opts.MetricsToken = metrics.Token(testToken)
			}
			tc := startCoordinator(t, opts)
			for _, who := range []struct {
				name string
				role pki.Role
				want int
			}{{"alice", pki.Client, 200}, {"coordinator", pki.Coordinator, 200}, {"n1", pki.Agent, 403}} {
				status, body, err := scrape(t, tc.addr, issue(t, tc.ca, who.name, who.role), "")
				if err != nil || status != who.want {
					t.Errorf("%s %s: HTTP %d %v, want %d", who.role, who.name, status, err, who.want)
				}
				if who.want == 200 && !strings.Contains(body, "# TYPE cairn_jobs gauge") {
					t.Errorf("%s: no cairn_jobs in\n%s", who.role, body)
				}
			}
			status, _, err := scrape(t, tc.addr, nil, "")
			if !withToken {
				if err == nil {
					t.Fatalf("no certificate: HTTP %d, want no TLS connection", status)
				}
			} else if err != nil || status != http.StatusUnauthorized {
				t.Errorf("no certificate, no token: HTTP %d %v, want 401", status, err)
			}
			status, body, err := scrape(t, tc.addr, nil, testToken)
			switch {
			case !withToken && err == nil:
				t.Errorf("a token where none is set: HTTP %d, want no TLS connection", status)
			case withToken && (err != nil || status != 200 || !strings.Contains(body, "cairn_jobs")):
				t.Errorf("the token: HTTP %d %v", status, err)
			}
			if !withToken {
				return
			}
			if status, _, err := scrape(t, tc.addr, nil, testToken+"x"); err != nil || status != http.StatusUnauthorized {
				t.Errorf("a wrong token: HTTP %d %v, want 401", status, err)
			}
			// The token reads nothing else.
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 10 * time.Second}
			defer hc.CloseIdleConnections()
			for _, r := range []struct{ method, path string }{{"GET", coordv1.PathJobs}, {"GET", coordv1.PathEvents}, {"POST", metrics.Path}, {"GET", coordv1.PathHealth}} {
				req, _ := http.NewRequest(r.method, "https://"+tc.addr+r.path, nil)
				req.Header.Set("Authorization", "Bearer "+testToken)
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s %s with the token: HTTP %d, want 401", r.method, r.path, resp.StatusCode)
				}
			}
			// Plain HTTP is refused.
			resp, err := http.Get("http://" + tc.addr + metrics.Path)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					t.Error("plain HTTP: 200")
				}
			}
		})
	}
}

// parse reads the text format into values by series, as written.
func parse(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestMetricsFromEvents: a job's life on in-memory agents (checkpoints
// replicated, a migration, a node lost and the job restarted): what a
// scrape says is what the events said, with the records' per-rank
// figures.
func TestMetricsFromEvents(t *testing.T) {
	x, err := events.New(events.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewCoord(metrics.CoordOptions{})
	e := newMemEnv(t, 4, memagent.Options{}, coord.Options{Metrics: m, Events: x})
	c := e.start()
	ctx := context.Background()
	c.runJob(t, "ring", 3, 1, "n0", "n1", "n2")
	c.checkpoint(t, "ring", 1)
	c.checkpoint(t, "ring", 1)
	if mig, err := c.Migrate(ctx, "ring", coordv1.Migrate{Rank: 0, To: "n3"}); err != nil || mig.State != coordv1.MigrationDone {
		t.Fatalf("migrate: %+v %v", mig, err)
	}
	e.mc.Kill("n1")
	waitFor(t, 15*time.Second, "restart after n1 died", func() bool { return e.settled(c, "ring", 15*time.Second).Restarts == 1 })

	// The repair makes the lost copies again: once every checkpoint is
	// protected, no more events come.
	waitFor(t, 10*time.Second, "checkpoints protected again", func() bool {
		cks, err := c.Checkpoints(ctx, "ring")
		return err == nil && cks[0].State == coordv1.CkptProtected && cks[1].State == coordv1.CkptProtected
	})
	cks, err := c.Checkpoints(ctx, "ring")
	if err != nil {
		t.Fatal(err)
	}
	// The metrics follow the events a moment later.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		w := httptest.NewRecorder()
		metrics.Handler(m).ServeHTTP(w, httptest.NewRequest("GET", metrics.Path, nil))
		wrong := fromEvents(t, x.History(events.Filter{Job: "ring"}), cks[len(cks)-1], parse(t, w.Body.String()))
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the metrics disagree with the events:\n%s", strings.Join(wrong, "\n"))
		}
	}
}

// fromEvents lists where the series got differ from what the events of
// the ring's life say, with newest its newest checkpoint's record.
func fromEvents(t *testing.T, evs []evv1.Event, newest coordv1.Ckpt, got map[string]float64) []string {
	count := func(typ string) (n int, bytes int64, last evv1.Event) {
		for _, ev := range evs {
			if ev.Type == typ {
				n, bytes, last = n+1, bytes+ev.Bytes, ev
			}
		}
		return
	}
	durable, imageBytes, lastDurable := count(evv1.CkptDurable)
	copies, copied, _ := count(evv1.ReplicaCopied)
	protected, _, _ := count(evv1.CkptProtected)
	_, _, migrated := count(evv1.MigrationDone)
	if durable != 2 || copies < 6 {
		t.Fatalf("%d durable checkpoints, %d copies in the events", durable, copies)
	}
	want := map[string]float64{
		`cairn_checkpoints_durable_total{job_name="ring"}`:                  float64(durable),
		`cairn_checkpoints_protected_total{job_name="ring"}`:                float64(protected),
		`cairn_checkpoint_image_bytes_total{job_name="ring"}`:               float64(imageBytes),
		`cairn_checkpoint_last_image_bytes{job_name="ring"}`:                float64(lastDurable.Bytes),
		`cairn_checkpoint_last_durable_number{job_name="ring"}`:             float64(lastDurable.Ckpt),
		`cairn_checkpoint_last_durable_timestamp_seconds{job_name="ring"}`:  float64(lastDurable.Time.UnixNano()) / 1e9,
		`cairn_checkpoint_stall_seconds_count{job_name="ring"}`:             float64(durable),
		`cairn_replica_copies_total{job_name="ring"}`:                       float64(copies),
		`cairn_replica_copied_bytes_total{job_name="ring"}`:                 float64(copied),
		`cairn_replication_lag_seconds{job_name="ring"}`:                    0,
		`cairn_job_restarts_total{job_name="ring"}`:                         1,
		`cairn_migrations_total{job_name="ring",result="done"}`:             1,
		`cairn_migration_moved_bytes_total{job_name="ring"}`:                float64(migrated.Bytes),
		`cairn_migration_phase_seconds_count{job_name="ring",phase="move"}`: 1,
		`cairn_node_alive{node="n1"}`:                                       0,
		`cairn_node_alive{node="n0"}`:                                       1,
		`cairn_job_state{job_name="ring",state="running"}`:                  1,
		`cairn_job_replicas{job_name="ring"}`:                               1,
		`cairn_job_ranks{job_name="ring"}`:                                  3,
	}
	for _, r := range newest.Ranks {
		want[fmt.Sprintf(`cairn_rank_checkpoint_image_bytes{job_name="ring",rank="%d"}`, r.Rank)] = float64(r.Size)
		want[fmt.Sprintf(`cairn_rank_checkpoint_dump_seconds{job_name="ring",rank="%d"}`, r.Rank)] = r.Dump.Seconds()
	}
	var out []string
	for k, v := range want {
		g, ok := got[k]
		if !ok || g-v > 1e-6 || v-g > 1e-6 {
			out = append(out, fmt.Sprintf("%s = %v (%v), want %v", k, g, ok, v))
		}
	}
	return out
}

// TestMetricsAfterCoordinatorRestart: a coordinator that takes over reads
// back the events of the one before: the newest checkpoints' gauges and
// per-rank series are there at once, and its counters count only what it
// sees itself.
func TestMetricsAfterCoordinatorRestart(t *testing.T) {
	x, err := events.New(events.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{Metrics: metrics.NewCoord(metrics.CoordOptions{}), Events: x})
	c1 := e.start()
	c1.runJob(t, "ring", 2, 1, "n0", "n1")
	seq := c1.checkpoint(t, "ring", 1)
	// The catalog says protected a moment before the event is published:
	// the history must hold it before c1 dies.
	waitFor(t, 5*time.Second, "checkpoint.protected published", func() bool {
		return len(x.History(events.Filter{Type: evv1.CkptProtected})) > 0
	})
	e.kill(c1)

	m := metrics.NewCoord(metrics.CoordOptions{})
	e.opts.Metrics = m
	c2 := e.start()
	cks, err := c2.Checkpoints(context.Background(), "ring")
	if err != nil {
		t.Fatal(err)
	}
	var durable evv1.Event
	for _, ev := range x.History(events.Filter{Type: evv1.CkptDurable}) {
		durable = ev
	}
	scrapeM := func() map[string]float64 {
		w := httptest.NewRecorder()
		metrics.Handler(m).ServeHTTP(w, httptest.NewRequest("GET", metrics.Path, nil))
		return parse(t, w.Body.String())
	}
	var got map[string]float64
	waitFor(t, 5*time.Second, "the history replayed", func() bool {
		got = scrapeM()
		return got[`cairn_rank_checkpoint_image_bytes{job_name="ring",rank="1"}`] == float64(cks[0].Ranks[1].Size)
	})
	for k, v := range map[string]float64{
		`cairn_checkpoint_last_durable_number{job_name="ring"}`:            float64(seq),
		`cairn_checkpoint_last_durable_timestamp_seconds{job_name="ring"}`: float64(durable.Time.UnixNano()) / 1e9,
		`cairn_checkpoint_last_protected_number{job_name="ring"}`:          float64(seq),
		`cairn_replication_lag_seconds{job_name="ring"}`:                   0,
	} {
		if g, ok := got[k]; !ok || g-v > 1e-6 || v-g > 1e-6 {
			t.Errorf("%s = %v (%v), want %v", k, g, ok, v)
		}
	}
	for _, k := range []string{`cairn_checkpoints_durable_total{job_name="ring"}`, `cairn_replica_copies_total{job_name="ring"}`} {
		if _, ok := got[k]; ok {
			t.Errorf("%s counts what the coordinator before saw", k)
		}
	}
	c2.checkpoint(t, "ring", 1)
	waitFor(t, 5*time.Second, "the new checkpoint counted", func() bool {
		got = scrapeM()
		return got[`cairn_checkpoints_durable_total{job_name="ring"}`] == 1 && got[`cairn_replica_copies_total{job_name="ring"}`] == 2 &&
			got[`cairn_checkpoint_last_durable_number{job_name="ring"}`] == float64(seq+1)
	})
}

// TestPrometheusTargets: the coordinator lists every node it knows at its
// agent's address, in Prometheus's HTTP service discovery format, to
// clients and to the read-only token; not to agents.
func TestPrometheusTargets(t *testing.T) {
	tc := startCoordinator(t, coord.Options{Metrics: metrics.NewCoord(metrics.CoordOptions{}), MetricsToken: metrics.Token(testToken)})
	ctx := context.Background()
	for i, n := range []string{"n2", "n1"} {
		co := rpc.NewCoordClient(tc.addr, issue(t, tc.ca, n, pki.Agent))
		j := coordv1.Join{Name: n, Addr: fmt.Sprintf("192.0.2.%d:7420", i+1), Underlay: fmt.Sprintf("192.0.2.%d", i+1),
			Labels: map[string]string{"rack": "r" + n, "gpu-model": "none"}, API: coordv1.APIVersion}
		if _, err := co.Join(ctx, j); err != nil {
			t.Fatal(err)
		}
		co.Close()
	}
	targets := func(creds *pki.Credentials, token string) (int, []metrics.TargetGroup) {
		t.Helper()
		status, body, err := get(t, tc.addr, metrics.TargetsPath, creds, token)
		if err != nil {
			t.Fatal(err)
		}
		var out []metrics.TargetGroup
		if status == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &out); err != nil {
				t.Fatal(err)
			}
		}
		return status, out
	}
	for _, who := range []struct {
		name  string
		creds *pki.Credentials
		token string
	}{{"a client", issue(t, tc.ca, "prometheus", pki.Client), ""}, {"the token", nil, testToken}} {
		status, groups := targets(who.creds, who.token)
		if status != http.StatusOK || len(groups) != 2 {
			t.Fatalf("%s: HTTP %d, %+v; want both nodes", who.name, status, groups)
		}
		g := groups[0]
		if g.Targets[0] != "192.0.2.2:7420" || g.Labels["node"] != "n1" || g.Labels["__meta_cairn_alive"] != "true" ||
			g.Labels["__meta_cairn_label_rack"] != "rn1" || g.Labels["__meta_cairn_label_gpu_model"] != "none" {
			t.Errorf("%s: first group %+v, want n1 at 192.0.2.2:7420 with its labels", who.name, g)
		}
	}
	if status, _ := targets(issue(t, tc.ca, "n1", pki.Agent), ""); status != http.StatusForbidden {
		t.Errorf("an agent: HTTP %d, want 403", status)
	}
	if status, _ := targets(nil, "not-the-token-at-all"); status != http.StatusUnauthorized {
		t.Errorf("a wrong token: HTTP %d, want 401", status)
	}
}
