package metrics

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where the coordinator and every agent serve their metrics, on
// their API's listener.
const Path = "/metrics"

// Handler serves what g gathers in Prometheus's text format (or
// OpenMetrics, if asked for). A family that fails to gather is left out
// and the rest served.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, EnableOpenMetrics: true})
}

// Token is a read-only bearer token an operator sets for scrapers without
// a client certificate: it allows GET /metrics (and the coordinator's
// GET TargetsPath) and nothing else. An empty
// Token allows nothing.
type Token []byte

// MinTokenLen is the shortest token LoadToken accepts.
const MinTokenLen = 16

// LoadToken reads a token from file: its content without surrounding
// white space, at least MinTokenLen bytes. An empty path is no token.
func LoadToken(file string) (Token, error) {
	if file == "" {
		return nil, nil
	}
	st, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("metrics token: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("metrics token file %s: readable by others (mode %v); chmod 600 it", file, st.Mode().Perm())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("metrics token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if len(t) < MinTokenLen {
		return nil, fmt.Errorf("metrics token in %s: shorter than %d bytes", file, MinTokenLen)
	}
	if strings.ContainsAny(t, " \t\r\n") {
		return nil, fmt.Errorf("metrics token in %s: white space inside", file)
	}
	return Token(t), nil
}

// Allows reports whether r is a GET of Path whose Authorization is the
// token as a bearer token, compared in constant time.
func (t Token) Allows(r *http.Request) bool {
	if len(t) == 0 || r.Method != http.MethodGet || r.URL.Path != Path && r.URL.Path != TargetsPath {
		return false
	}
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), t) == 1
}
