package metrics_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/metrics"
)

func TestLoadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if tok, err := metrics.LoadToken(""); tok != nil || err != nil {
		t.Errorf("no file: %q %v, want no token", tok, err)
	}
	if tok, err := metrics.LoadToken(write("good", "  0123456789abcdef0123\n")); err != nil || string(tok) != "0123456789abcdef0123" {
		t.Errorf("good token: %q %v", tok, err)
	}
	for name, content := range map[string]string{"short": "0123456789abcde\n", "space": "0123456789 abcdef0123", "empty": "\n"} {
		if tok, err := metrics.LoadToken(write(name, content)); err == nil {
			t.Errorf("%s token %q accepted", name, tok)
		}
	}
	if _, err := metrics.LoadToken(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file gave a token")
	}
	open := write("open", "0123456789abcdef0123\n")
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	if tok, err := metrics.LoadToken(open); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a token file others may read: %q %v, want refused", tok, err)
	}
}

// TestTokenAllows: the token allows GET /metrics with itself as the bearer
// token, and nothing else.
func TestTokenAllows(t *testing.T) {
	tok := metrics.Token("0123456789abcdef0123")
	for _, tc := range []struct {
		name, method, path, auth string
		want                     bool
	}{
		{"bearer", "GET", "/metrics", "Bearer 0123456789abcdef0123", true},
		{"scheme in lower case", "GET", "/metrics", "bearer 0123456789abcdef0123", true},
		{"none", "GET", "/metrics", "", false},
		{"wrong", "GET", "/metrics", "Bearer 0123456789abcdef0124", false},
		{"prefix", "GET", "/metrics", "Bearer 0123456789abcdef012", false},
		{"longer", "GET", "/metrics", "Bearer 0123456789abcdef01234", false},
		{"basic", "GET", "/metrics", "Basic 0123456789abcdef0123", false},
		{"no scheme", "GET", "/metrics", "0123456789abcdef0123", false},
		{"another path", "GET", "/v1/jobs", "Bearer 0123456789abcdef0123", false},
		{"below", "GET", "/metrics/x", "Bearer 0123456789abcdef0123", false},
		{"POST", "POST", "/metrics", "Bearer 0123456789abcdef0123", false},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		if tc.auth != "" {
			r.Header.Set("Authorization", tc.auth)
		}
		if got := tok.Allows(r); got != tc.want {
			t.Errorf("%s: Allows = %v, want %v", tc.name, got, tc.want)
		}
		if metrics.Token(nil).Allows(r) {
			t.Errorf("%s: no token allows it", tc.name)
		}
	}
}

// TestHandler: the text format, with the coordinator's families.
func TestHandler(t *testing.T) {
	m := metrics.NewCoord(metrics.CoordOptions{})
	m.Event(evDurable("ring", 1, 1234), true)
	w := httptest.NewRecorder()
	metrics.Handler(m).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body := w.Body.String()
	if w.Code != http.StatusOK || !strings.Contains(body, `cairn_checkpoint_image_bytes_total{job_name="ring"} 1234`) ||
		!strings.Contains(body, "# TYPE cairn_checkpoints_durable_total counter") {
		t.Fatalf("HTTP %d:\n%s", w.Code, body)
	}
}
