package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/dashboard"
	"github.com/cairn-hpc/cairn/internal/events"
)

// cluster stands in for the coordinator: one job, "ring", on two of
// three nodes, with a checkpoint and a migration. It records every call.
type cluster struct {
	mu    sync.Mutex
	calls []string
	t0    time.Time
}

func (c *cluster) note(call string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, call)
}

func (c *cluster) Calls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls...)
}

func (c *cluster) Nodes(context.Context) ([]coordv1.Node, error) {
	c.note("Nodes")
	return []coordv1.Node{
		{Name: "n1", Alive: true, Ranks: 1},
		{Name: "n2", Alive: true, Ranks: 1, Health: []string{"disk: 2% free"}},
		{Name: "n3", Alive: false, Spare: true},
	}, nil
}

func (c *cluster) job() coordv1.Job {
	return coordv1.Job{RunJob: coordv1.RunJob{Name: "ring", Ranks: 2, Replicas: 1, Args: []string{"solver", "--password=hunter2"},
		Env: []string{"API_KEY=hunter2"}}, State: coordv1.JobRunning, Placement: []string{"n1", "n2"}, Created: c.t0, LastCkpt: 1}
}

func (c *cluster) Jobs(context.Context) ([]coordv1.Job, error) {
	c.note("Jobs")
	return []coordv1.Job{c.job()}, nil
}

func (c *cluster) Status(_ context.Context, job string) (*coordv1.JobStatus, error) {
	c.note("Status " + job)
	if job != "ring" {
		return nil, &agentv1.Error{Code: agentv1.CodeNotFound, Message: "no job " + job}
	}
	return &coordv1.JobStatus{Job: c.job(), RankStates: []coordv1.Rank{
		{Rank: 0, Node: "n1", Status: "running", Pid: 10}, {Rank: 1, Node: "n2", Status: "running", Pid: 11}}}, nil
}

func (c *cluster) Checkpoints(_ context.Context, job string) ([]coordv1.Ckpt, error) {
	c.note("Checkpoints " + job)
	return []coordv1.Ckpt{{Job: job, Seq: 1, State: coordv1.CkptProtected, Created: c.t0.Add(time.Second), Stall: 300 * time.Millisecond,
		Bytes: 9 << 20, Ranks: []coordv1.CkptRank{{Rank: 0, Node: "n1", Copies: []string{"n1", "n2"}}, {Rank: 1, Node: "n2", Copies: []string{"n2", "n3"}}}}}, nil
}

func (c *cluster) Migrations(_ context.Context, job string) ([]coordv1.Migration, error) {
	c.note("Migrations " + job)
	return []coordv1.Migration{{Job: job, Seq: 2, Rank: 1, From: "n3", To: "n2", State: coordv1.MigrationDone, Started: c.t0.Add(2 * time.Second)}}, nil
}

func newDashboard(t *testing.T, cfg dashboard.Config) (*dashboard.Dashboard, *cluster, *events.Exchange) {
	t.Helper()
	ev, err := events.New(events.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.Close() })
	c := &cluster{t0: time.Now().Add(-time.Minute)}
	cfg.Source, cfg.Events, cfg.Cluster = c, ev, "c0ffee"
	ev.Publish(evv1.Event{Type: evv1.JobStarted, Job: "ring", Time: c.t0})
	return dashboard.New(cfg), c, ev
}

// get serves one request and returns the response with its body read.
func get(h http.Handler, method, target string, hdr ...string) (*http.Response, string) {
	r := httptest.NewRequest(method, target, nil)
	r.Host = "127.0.0.1:7401"
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	resp := w.Result()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestRoutes: the page, its script and style, and the data, every answer
// with headers that keep the page to itself; nothing of a job's command
// line or environment.
func TestRoutes(t *testing.T) {
	d, _, _ := newDashboard(t, dashboard.Config{})
	tests := []struct {
		name, path string
		status     int
		ctype      string
		has        []string
	}{
		{"page", "/ui/", 200, "text/html", []string{`src="/ui/app.js"`, `id="timeline"`}},
		{"script", "/ui/app.js", 200, "text/javascript", []string{"EventSource"}},
		{"style", "/ui/style.css", 200, "text/css", nil},
		{"cluster", "/ui/api/cluster", 200, "application/json", []string{`"cluster":"c0ffee"`, `"name":"n3"`, `"spare":true`, `"jobs":["ring"]`, `"disk: 2% free"`}},
		{"job", "/ui/api/jobs/ring", 200, "application/json", []string{`"kind":"checkpoint"`, `"protected":true`, `"kind":"migration"`, `"type":"job.started"`, `"pid":11`}},
		{"no such job", "/ui/api/jobs/nope", 404, "application/json", []string{"no job nope"}},
		{"bad job name", "/ui/api/jobs/BAD", 400, "application/json", nil},
		{"elsewhere", "/ui/api/nodes", 404, "application/json", nil},
		{"no slash", "/ui", 301, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(d, "GET", tc.path)
			if resp.StatusCode != tc.status {
				t.Fatalf("GET %s: %d, want %d: %s", tc.path, resp.StatusCode, tc.status, body)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, tc.ctype) {
				t.Errorf("content type %q, want %q", ct, tc.ctype)
			}
			for _, s := range tc.has {
				if !strings.Contains(body, s) {
					t.Errorf("no %s in %s", s, body)
				}
			}
			if strings.Contains(body, "hunter2") {
				t.Errorf("the job's command line or environment is shown: %s", body)
			}
			csp := resp.Header.Get("Content-Security-Policy")
			if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") ||
				resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Cache-Control") != "no-store" {
				t.Errorf("headers %v", resp.Header)
			}
		})
	}
}

// TestReadOnly: every method but GET and HEAD is refused on every path,
// before anything of the cluster is read.
func TestReadOnly(t *testing.T) {
	d, c, _ := newDashboard(t, dashboard.Config{})
	h := d.Token([]byte("0123456789abcdef0123"))
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"} {
		for _, p := range []string{"/ui/", "/ui/api/cluster", "/ui/api/jobs/ring", "/ui/api/events", "/ui/login?token=0123456789abcdef0123"} {
			for name, h := range map[string]http.Handler{"dashboard": d, "token": h} {
				resp, body := get(h, m, p, "Authorization", "Bearer 0123456789abcdef0123")
				if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
					t.Errorf("%s: %s %s: %d %s", name, m, p, resp.StatusCode, body)
				}
				if resp.Header.Get("Set-Cookie") != "" {
					t.Errorf("%s: %s %s set a cookie", name, m, p)
				}
			}
		}
	}
	if calls := c.Calls(); len(calls) != 0 {
		t.Errorf("refused requests read the cluster: %v", calls)
	}
	if resp, _ := get(d, "HEAD", "/ui/api/cluster"); resp.StatusCode != 200 {
		t.Errorf("HEAD: %d", resp.StatusCode)
	}
}

// TestToken: on the read-only port, nothing but a login form and the
// style goes to a browser without the session cookie or the token; the
// cookie is had by logging in with the token, is HttpOnly, Secure,
// SameSite=Strict and not the token itself; requests addressed to
// another name than the loopback's are refused, cookie or not.
func TestToken(t *testing.T) {
	const token = "s3cret-token-of-the-dashboard"
	d, c, _ := newDashboard(t, dashboard.Config{})
	h := d.Token([]byte(token))

	for _, p := range []string{"/ui/", "/ui/app.js", "/ui/api/cluster", "/ui/api/jobs/ring", "/ui/api/events"} {
		resp, body := get(h, "GET", p)
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "n1") {
			t.Errorf("GET %s without logging in: %d %s", p, resp.StatusCode, body)
		}
	}
	if resp, body := get(h, "GET", "/ui/"); !strings.Contains(body, `name="token"`) || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Errorf("the page without logging in is no login form: %s", body)
	}
	if resp, _ := get(h, "GET", "/ui/style.css"); resp.StatusCode != 200 {
		t.Errorf("the login form's style: %d", resp.StatusCode)
	}
	for _, bad := range []string{"/ui/login?token=wrong", "/ui/login?token=" + token + "&token=" + token, "/ui/login?token="} {
		resp, body := get(h, "GET", bad)
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Set-Cookie") != "" || !strings.Contains(body, "not the dashboard's token") {
			t.Errorf("GET %s: %d %v", bad, resp.StatusCode, resp.Header)
		}
	}
	for _, bearer := range []string{"Bearer wrong", "Bearer " + token + "x", "Basic " + token, token} {
		if resp, _ := get(h, "GET", "/ui/api/cluster", "Authorization", bearer); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d", bearer, resp.StatusCode)
		}
	}
	if calls := c.Calls(); len(calls) != 0 {
		t.Fatalf("the cluster was read for callers that had not logged in: %v", calls)
	}

	resp, _ := get(h, "GET", "/ui/login?token="+token)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/" {
		t.Fatalf("login: %d %v", resp.StatusCode, resp.Header)
	}
	cookies := resp.Cookies()
	if len(cookies) != 1 {
		t.Fatalf("login cookies: %v", cookies)
	}
	ck := cookies[0]
	if ck.Name != dashboard.CookieName || !ck.HttpOnly || !ck.Secure || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/ui/" ||
		strings.Contains(ck.Value, token) || len(ck.Value) < 32 {
		t.Fatalf("cookie %+v", ck)
	}
	cookie := ck.Name + "=" + ck.Value
	if resp, body := get(h, "GET", "/ui/api/cluster", "Cookie", cookie); resp.StatusCode != 200 || !strings.Contains(body, `"n1"`) {
		t.Errorf("with the cookie: %d %s", resp.StatusCode, body)
	}
	if resp, _ := get(h, "GET", "/ui/", "Cookie", cookie); resp.StatusCode != 200 {
		t.Errorf("the page with the cookie: %d", resp.StatusCode)
	}
	other := ck.Value[:len(ck.Value)-1] + map[bool]string{true: "1", false: "0"}[strings.HasSuffix(ck.Value, "0")]
	if resp, _ := get(h, "GET", "/ui/api/cluster", "Cookie", ck.Name+"="+other); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("with another cookie: %d", resp.StatusCode)
	}
	if resp, _ := get(h, "GET", "/ui/api/cluster", "Authorization", "Bearer "+token); resp.StatusCode != 200 {
		t.Errorf("with the token: %d", resp.StatusCode)
	}
	for _, host := range []string{"evil.example", "evil.example:7401", "10.0.0.1:7401", "localhost.evil.example"} {
		r := httptest.NewRequest("GET", "/ui/api/cluster", nil)
		r.Host = host
		r.Header.Set("Cookie", cookie)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusMisdirectedRequest {
			t.Errorf("Host %s: %d", host, w.Code)
		}
	}
	for _, host := range []string{"localhost:7401", "[::1]:7401", "127.0.0.2", "LOCALHOST"} {
		r := httptest.NewRequest("GET", "/ui/api/cluster", nil)
		r.Host = host
		r.Header.Set("Cookie", cookie)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 200 {
			t.Errorf("Host %s: %d", host, w.Code)
		}
	}
}

// sseReader reads a Server-Sent Events stream, one message at a time.
type sseReader struct{ r *bufio.Reader }

// next returns the next message's fields (comments left out).
func (s sseReader) next(t *testing.T) map[string]string {
	t.Helper()
	msg := map[string]string{}
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			t.Fatalf("event stream: %v", err)
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "" && len(msg) > 0:
			return msg
		case line == "" || strings.HasPrefix(line, ":"):
		default:
			k, v, _ := strings.Cut(line, ": ")
			msg[k] = v
		}
	}
}

func openStream(t *testing.T, url string, hdr ...string) (*http.Response, sseReader) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, sseReader{bufio.NewReader(resp.Body)}
}

// TestEvents: the stream says it is ready once it is live, then sends each
// new event with its number as its id; a browser that comes back with the
// last id it had gets what it missed first; the streams open at once are
// bounded.
func TestEvents(t *testing.T) {
	d, _, ev := newDashboard(t, dashboard.Config{MaxStreams: 2})
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close) // after the streams' bodies are closed

	resp, s := openStream(t, srv.URL+"/ui/api/events")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %v", resp.StatusCode, resp.Header)
	}
	if m := s.next(t); m["event"] != "ready" {
		t.Fatalf("first message %v, want ready", m)
	}
	a := ev.Publish(evv1.Event{Type: evv1.CkptCommitted, Job: "ring", Ckpt: 1})
	b := ev.Publish(evv1.Event{Type: evv1.NodeLost, Node: "n3"})
	for _, want := range []evv1.Event{a, b} {
		m := s.next(t)
		var got evv1.Event
		if err := json.Unmarshal([]byte(m["data"]), &got); err != nil {
			t.Fatal(err)
		}
		if m["id"] != strconv.FormatUint(want.Seq, 10) || got.Seq != want.Seq || got.Type != want.Type {
			t.Fatalf("message %v, want event %+v", m, want)
		}
	}

	// Back after event a: b first.
	_, s2 := openStream(t, srv.URL+"/ui/api/events", "Last-Event-ID", "2")
	if m := s2.next(t); m["event"] != "ready" {
		t.Fatalf("first message %v", m)
	}
	if m := s2.next(t); m["id"] != "3" || !strings.Contains(m["data"], evv1.NodeLost) {
		t.Fatalf("resumed stream: %v, want event 3", m)
	}
	// Two streams are open: a third is refused.
	resp3, err := http.Get(srv.URL + "/ui/api/events")
	if err != nil {
		t.Fatal(err)
	}
	resp3.Body.Close()
	if resp3.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a third stream: %d", resp3.StatusCode)
	}
	if resp, _ := get(d, "GET", "/ui/api/events", "Last-Event-ID", "x"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("Last-Event-ID x: %d", resp.StatusCode)
	}
}

func TestCheckListen(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:7401": true, "127.0.0.1:0": true, "[::1]:7401": true, "localhost:7401": true,
		"0.0.0.0:7401": false, ":7401": false, "10.1.2.3:7401": false, "example.com:7401": false, "127.0.0.1": false,
	} {
		if err := dashboard.CheckListen(addr); (err == nil) != ok {
			t.Errorf("CheckListen(%s): %v", addr, err)
		}
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tok, err := dashboard.ReadToken(write("good", "0123456789abcdefXYZ\n", 0o600))
	if err != nil || string(tok) != "0123456789abcdefXYZ" {
		t.Errorf("good token: %q %v", tok, err)
	}
	if _, err := dashboard.ReadToken(write("short", "0123456789\n", 0o600)); err == nil {
		t.Error("a short token was taken")
	}
	if _, err := dashboard.ReadToken(write("open", "0123456789abcdefXYZ", 0o644)); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Errorf("a token others may read: %v", err)
	}
	if _, err := dashboard.ReadToken(filepath.Join(dir, "none")); err == nil {
		t.Error("no file: no error")
	}
}
