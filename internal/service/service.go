// Package service is what cairn's daemons (the agent and the coordinator)
// tell whatever runs them: the service manager, through systemd's
// sd_notify protocol (ready, status, stopping; nothing is sent without
// $NOTIFY_SOCKET), and probes, through an unauthenticated health endpoint
// on a listener of its own, plain HTTP, that holds no data.
//
// A daemon takes $NOTIFY_SOCKET out of its environment first (Take): the
// agent runs runc, which would otherwise hand the socket to every
// container it starts and wait for the container to say it is ready.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

var notifySocket struct {
	sync.Mutex
	path string
}

// Take takes $NOTIFY_SOCKET out of the environment, for this process's
// children not to see it, and keeps it for Ready, Status and Stopping.
// A daemon calls it before it starts any process.
func Take() {
	notifySocket.Lock()
	defer notifySocket.Unlock()
	if p := os.Getenv("NOTIFY_SOCKET"); p != "" {
		notifySocket.path = p
	}
	os.Unsetenv("NOTIFY_SOCKET")
}

// Ready tells the service manager the daemon is serving, with a status
// line: systemd then deems a Type=notify unit started.
func Ready(status string, log *slog.Logger) { notify(log, "READY=1", "STATUS="+oneLine(status)) }

// Status tells the service manager what the daemon is doing now (shown by
// systemctl status).
func Status(status string, log *slog.Logger) { notify(log, "STATUS="+oneLine(status)) }

// Stopping tells the service manager the daemon is shutting down.
func Stopping(log *slog.Logger) { notify(log, "STOPPING=1", "STATUS=stopping") }

// notify sends lines as one datagram to the socket Take kept, if any.
func notify(log *slog.Logger, lines ...string) {
	notifySocket.Lock()
	path := notifySocket.path
	notifySocket.Unlock()
	if path == "" {
		return
	}
	addr := &net.UnixAddr{Name: path, Net: "unixgram"}
	if strings.HasPrefix(path, "@") {
		addr.Name = "\x00" + path[1:] // an abstract socket
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err == nil {
		_, err = conn.Write([]byte(strings.Join(lines, "\n")))
		conn.Close()
	}
	if err != nil {
		log.Warn("tell the service manager", "state", lines[0], "socket", path, "err", err)
	}
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// HealthPath is where the health endpoint answers.
const HealthPath = "/healthz"

// ServeHealth answers GET HealthPath on addr with 200 "ok" for as long
// as ctx lasts, and everything else with 404: a probe learns the daemon is
// up and serving, nothing more. It returns once it listens; the listener
// closes when ctx is done.
func ServeHealth(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+HealthPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
		MaxHeaderBytes: 8 << 10, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("health endpoint stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	return ln.Addr(), nil
}
