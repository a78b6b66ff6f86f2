package testutil

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/proc"
)

// The browser of the end-to-end tests: Debian's Chromium and its
// ChromeDriver (scripts/setup.sh installs both).
const (
	Chromium     = "/usr/bin/chromium"
	ChromeDriver = "/usr/bin/chromedriver"
)

// chromiumArgs run Chromium headless as root, with nothing of its own
// reaching out to the network.
var chromiumArgs = []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
	"--disable-background-networking", "--disable-component-update", "--disable-sync",
	"--disable-dev-shm-usage", "--window-size=1280,1600"}

// Browser is a headless Chromium driven through ChromeDriver's W3C
// WebDriver API (JSON over HTTP on loopback), with a fresh profile. The
// test's cleanup ends the session, kills ChromeDriver and every process
// it started, by pid, and removes the profile, whether the test passed
// or not.
type Browser struct {
	t       testing.TB
	base    string // ChromeDriver's URL
	session string
	dir     string // profile and logs
	driver  *exec.Cmd
	hc      *http.Client
}

// NewBrowser starts ChromeDriver and a Chromium session; without them the
// test fails, naming what to run.
func NewBrowser(t testing.TB) *Browser {
	t.Helper()
	for _, p := range []string{Chromium, ChromeDriver} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v (make setup installs Chromium and ChromeDriver)", p, err)
		}
	}
	dir, err := os.MkdirTemp("", "cairn-browser-")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	b := &Browser{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", port), dir: dir, hc: &http.Client{Timeout: 2 * time.Minute}}
	b.driver = exec.Command(ChromeDriver, fmt.Sprintf("--port=%d", port), "--log-path="+filepath.Join(dir, "chromedriver.log"))
	b.driver.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := b.driver.Start(); err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	WaitUntil(t, 30*time.Second, func() (bool, string) {
		var st struct {
			Ready bool `json:"ready"`
		}
		err := b.call(http.MethodGet, "/status", nil, &st)
		return err == nil && st.Ready, fmt.Sprintf("ChromeDriver not ready within 30s: %v", err)
	})
	caps := map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome",
		"goog:chromeOptions": map[string]any{
			"binary": Chromium,
			"args":   append(slices.Clone(chromiumArgs), "--user-data-dir="+filepath.Join(dir, "profile")),
		},
	}}}
	var s struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.call(http.MethodPost, "/session", caps, &s); err != nil {
		t.Fatalf("new Chromium session: %v", err)
	}
	b.session = s.SessionID
	return b
}

// call makes a WebDriver request and decodes its value into out.
func (b *Browser) call(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		j, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("%s %s: HTTP %d: %w", method, path, resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(r.Value, &e)
		return fmt.Errorf("%s %s: %s: %s", method, path, e.Error, e.Message)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(r.Value, out)
}

func (b *Browser) sessionCall(method, path string, in, out any) {
	b.t.Helper()
	if err := b.call(method, "/session/"+b.session+path, in, out); err != nil {
		b.t.Fatal(err)
	}
}

// Navigate loads url and waits until the document has loaded.
func (b *Browser) Navigate(url string) {
	b.t.Helper()
	b.sessionCall(http.MethodPost, "/url", map[string]string{"url": url}, nil)
}

// URL is the page's address.
func (b *Browser) URL() string {
	b.t.Helper()
	var u string
	b.sessionCall(http.MethodGet, "/url", nil, &u)
	return u
}

// Eval runs script (a function body; its arguments are args) in the page
// and decodes what it returns into out (nil: ignored).
func (b *Browser) Eval(out any, script string, args ...any) {
	b.t.Helper()
	if args == nil {
		args = []any{}
	}
	b.sessionCall(http.MethodPost, "/execute/sync", map[string]any{"script": script, "args": args}, out)
}

// Click clicks the first element that matches a CSS selector.
func (b *Browser) Click(css string) {
	b.t.Helper()
	var el map[string]string
	b.sessionCall(http.MethodPost, "/element", map[string]string{"using": "css selector", "value": css}, &el)
	for _, id := range el { // the one key is the W3C element identifier
		b.sessionCall(http.MethodPost, "/element/"+id+"/click", map[string]any{}, nil)
		return
	}
	b.t.Fatalf("no element %s", css)
}

// Screenshot saves a PNG of the page.
func (b *Browser) Screenshot(file string) {
	b.t.Helper()
	var s string
	b.sessionCall(http.MethodGet, "/screenshot", nil, &s)
	png, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(file, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// close ends the session, then kills ChromeDriver and whatever it left
// (Chromium's processes), each by pid, and removes the profile. When the
// test failed it shows the end of ChromeDriver's log.
func (b *Browser) close() {
	if b.session != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, b.base+"/session/"+b.session, nil)
		if resp, err := b.hc.Do(req); err == nil {
			resp.Body.Close()
		}
		cancel()
	}
	// Chromium's processes descend from ChromeDriver: the browser, its
	// zygotes and their renderers. Collect them before ChromeDriver
	// goes, which would leave them to init.
	pids := []int{b.driver.Process.Pid}
	for gen := pids; len(gen) > 0; {
		gen = proc.Children(gen...)
		pids = append(pids, gen...)
	}
	for _, pid := range mentioning(b.dir) { // any that left the tree
		if !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	for _, pid := range slices.Backward(pids) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = b.driver.Wait()
	for _, pid := range pids[1:] {
		deadline := time.Now().Add(10 * time.Second)
		for proc.Runs(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if proc.Runs(pid) {
			b.t.Errorf("browser process %d still runs after SIGKILL", pid)
		}
	}
	if b.t.Failed() {
		if log, err := os.ReadFile(filepath.Join(b.dir, "chromedriver.log")); err == nil {
			lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
			b.t.Logf("last lines of ChromeDriver's log:\n%s", strings.Join(lines[max(0, len(lines)-30):], "\n"))
		}
	}
	if err := os.RemoveAll(b.dir); err != nil {
		b.t.Errorf("remove the browser's profile: %v", err)
	}
}

// mentioning lists the processes whose command line mentions s.
func mentioning(s string) []int {
	var out []int
	files, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(b, []byte(s)) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(f)), "%d", &pid); err == nil && pid != os.Getpid() {
			out = append(out, pid)
		}
	}
	return out
}
