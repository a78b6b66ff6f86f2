package coord_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// TestDashboardRoute: the API serves the dashboard under /ui/ to client
// certificates, and only reads: an agent is refused, another method is
// not in the API, and a caller without a certificate gets no connection.
func TestDashboardRoute(t *testing.T) {
	tc := startCoordinator(t, coord.Options{})
	do := func(tlsCfg *tls.Config, method, path string) (int, string, error) {
		tr := &http.Transport{TLSClientConfig: tlsCfg}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequest(method, "https://"+tc.addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	client := pki.ClientConfig(issue(t, tc.ca, "alice", pki.Client), rpc.CoordServerName)
	for path, want := range map[string]string{"/ui/": `src="/ui/app.js"`, "/ui/api/cluster": `"cluster":"` + tc.ca.ClusterID + `"`} {
		status, body, err := do(client, "GET", path)
		if err != nil || status != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("client GET %s: %d %v %s", path, status, err, body)
		}
	}
	for _, m := range []string{"POST", "PUT", "DELETE"} {
		if status, body, err := do(client, m, "/ui/api/cluster"); err != nil || status != http.StatusNotFound {
			t.Errorf("client %s /ui/api/cluster: %d %v %s", m, status, err, body)
		}
	}
	agent := pki.ClientConfig(issue(t, tc.ca, "n1", pki.Agent), rpc.CoordServerName)
	if status, body, err := do(agent, "GET", "/ui/api/cluster"); err != nil || status != http.StatusForbidden {
		t.Errorf("agent GET /ui/api/cluster: %d %v %s", status, err, body)
	}
	if status, _, err := do(&tls.Config{InsecureSkipVerify: true}, "GET", "/ui/"); err == nil {
		t.Errorf("a caller without a certificate got HTTP %d", status)
	}
}
