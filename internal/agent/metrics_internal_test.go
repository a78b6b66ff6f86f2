package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/metrics"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/store"
)

// smallImage writes an image to ingest: a core file, pages, and an fs
// delta of one file.
func smallImage(t *testing.T, pages []byte) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(filepath.Join(src, image.CRIUDir), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"core-1.img": []byte("core"), "pages-1.img": pages} {
		if err := os.WriteFile(filepath.Join(src, image.CRIUDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var delta bytes.Buffer
	tw := tar.NewWriter(&delta)
	if err := tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("x"))
	tw.Close()
	if err := os.WriteFile(filepath.Join(src, image.DeltaName), delta.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestStoreStats: the store's figures, from its index and records; a
// node without a store yet has none.
func TestStoreStats(t *testing.T) {
	ctx := context.Background()
	d := t.TempDir()
	repo := image.Repo{Dir: filepath.Join(d, "cat"), StoreDir: filepath.Join(d, "store"), Compression: store.CompressionFastest}
	if st, err := storeStats(repo); err != nil || st != (metrics.StoreStats{}) {
		t.Fatalf("no store: %+v %v", st, err)
	}
	pages := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB that compresses
	for seq := 1; seq <= 2; seq++ {
		if err := repo.Ingest(ctx, smallImage(t, pages), &image.Record{Container: "ring.0", Seq: seq, Config: []byte(`{}`)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	st, err := storeStats(repo)
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := repo.All()
	if st.Images != 2 || st.Logical != recs[0].Logical+recs[1].Logical || st.Logical < 2<<20 {
		t.Errorf("images %d, logical %d; want 2 images of their records' sizes", st.Images, st.Logical)
	}
	// The second image is the first's chunks: deduplicated and compressed.
	if st.Raw <= 0 || st.Stored <= 0 || st.Stored >= st.Raw || 2*st.Raw > st.Logical+st.Logical/10 || st.Chunks == 0 || st.Packs == 0 {
		t.Errorf("store figures %+v: want deduplication and compression", st)
	}
}

// TestHealthProbes: the probes that run, each failing when its last run
// reported it.
func TestHealthProbes(t *testing.T) {
	h := NewHealth(HealthConfig{DataDir: "/", MinFreeDisk: 0.05, MinFreeMemory: 0.05, Command: "true"})
	h.last = []string{"memory: 1.0% available, below 5.0%"}
	got := h.probes()
	want := []metrics.Probe{{Name: "disk", OK: true}, {Name: "memory", OK: false}, {Name: "command", OK: true}}
	if len(got) != len(want) {
		t.Fatalf("probes %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("probe %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if p := NewHealth(HealthConfig{}).probes(); len(p) != 0 {
		t.Errorf("no probes configured: %+v", p)
	}
}

// TestMetricsRoute: the coordinator and clients scrape the node's
// metrics, other agents may not; without a certificate only the token
// does, and it reads nothing else.
func TestMetricsRoute(t *testing.T) {
	peers := callers(t)
	const token = "0123456789abcdef0123"
	s := &Server{
		Metrics: metrics.NewNode(metrics.NodeOptions{Node: "n1", Probes: func() []metrics.Probe {
			return []metrics.Probe{{Name: "disk", OK: true}}
		}}),
		MetricsToken: metrics.Token(token),
	}
	for _, tc := range []struct {
		name   string
		peer   *tls.ConnectionState
		method string
		path   string
		auth   string
		want   int
	}{
		{"coordinator", peers[pki.Coordinator], "GET", "/metrics", "", 200},
		{"client", peers[pki.Client], "GET", "/metrics", "", 200},
		{"agent", peers[pki.Agent], "GET", "/metrics", "", 403},
		{"agent with the token", peers[pki.Agent], "GET", "/metrics", "Bearer " + token, 200},
		{"token", nil, "GET", "/metrics", "Bearer " + token, 200},
		{"nothing", nil, "GET", "/metrics", "", 401},
		{"wrong token", nil, "GET", "/metrics", "Bearer " + token + "0", 401},
		{"token elsewhere", nil, "GET", "/v1/containers", "Bearer " + token, 401},
		{"token, POST", nil, "POST", "/metrics", "Bearer " + token, 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.path, nil)
			r.TLS = tc.peer
			if tc.auth != "" {
				r.Header.Set("Authorization", tc.auth)
			}
			w := httptest.NewRecorder()
			s.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("HTTP %d, want %d: %s", w.Code, tc.want, w.Body)
			}
			if tc.want == 200 && !strings.Contains(w.Body.String(), `cairn_health_probe_ok{node="n1",probe="disk"} 1`) {
				t.Errorf("no probe series in\n%s", w.Body)
			}
		})
	}
	// An agent without metrics has the route, and says so.
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/metrics", nil)
	r.TLS = peers[pki.Client]
	(&Server{}).ServeHTTP(w, r)
	if w.Code != http.StatusNotFound {
		t.Errorf("no metrics: HTTP %d, want 404", w.Code)
	}
}

// TestSpace: a dir yet to be made is measured on its parent's file
// system.
func TestSpace(t *testing.T) {
	d := t.TempDir()
	have, err := space(d)
	if err != nil || have.Size == 0 {
		t.Fatalf("space of %s: %+v %v", d, have, err)
	}
	later, err := space(filepath.Join(d, "staging", "n1"))
	if err != nil || later.Size != have.Size {
		t.Fatalf("space of a dir to be made: %+v %v, want %+v", later, err, have)
	}
}
