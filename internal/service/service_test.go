package service_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/service"
)

// TestNotify: with $NOTIFY_SOCKET, the daemon's ready, status and
// stopping reach the service manager's socket, each a datagram, and the
// variable is gone from the environment its children get; without it
// nothing is sent and nothing fails.
func TestNotify(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	t.Setenv("NOTIFY_SOCKET", "")
	service.Take()
	service.Ready("unheard", log)

	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	service.Take()
	if v, ok := os.LookupEnv("NOTIFY_SOCKET"); ok {
		t.Errorf("$NOTIFY_SOCKET=%q is still in the environment, for runc to pass into containers", v)
	}
	service.Ready("serving on 127.0.0.1:7420\nas n1", log)
	service.Status("joined", log)
	service.Stopping(log)
	want := []string{"READY=1\nSTATUS=serving on 127.0.0.1:7420 as n1", "STATUS=joined", "STOPPING=1\nSTATUS=stopping"}
	buf := make([]byte, 4096)
	for _, w := range want {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %q: %v", w, err)
		}
		if got := string(buf[:n]); got != w {
			t.Errorf("got %q, want %q", got, w)
		}
	}
}

// TestHealth: GET /healthz answers ok with no data; anything else is not
// there; the listener closes with its context.
func TestHealth(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addr, err := service.ServeHealth(ctx, "127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	get := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+addr.String()+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("GET", service.HealthPath); code != 200 || body != "ok\n" {
		t.Errorf("GET %s: %d %q, want 200 ok", service.HealthPath, code, body)
	}
	for _, c := range [][2]string{{"GET", "/"}, {"GET", "/metrics"}, {"POST", service.HealthPath}} {
		if code, _ := get(c[0], c[1]); code < 400 {
			t.Errorf("%s %s: %d, want an error", c[0], c[1], code)
		}
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := http.Get("http://" + addr.String() + service.HealthPath)
		if err != nil && strings.Contains(err.Error(), "refused") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the health endpoint still answers after its context ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
