package container_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// apiClient connects to the rank API's socket over and over: each time it
// says hello with a number, prints the reply and keeps the connection,
// which the other side closes. A connection refused or a missing socket
// is tried again 50 ms later, as the rank API's clients do.
const apiClient = `
import os, socket, time
conns, n = [], 0
while True:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(os.environ["CAIRN_SOCKET"])
    except OSError:
        s.close()
        time.sleep(0.05)
        continue
    n += 1
    try:
        s.sendall(b"hello %d\n" % n)
        reply = s.makefile("rb").readline().decode().strip()
    except OSError as e:
        reply = type(e).__name__
    print("got %d %s" % (n, reply), flush=True)
    conns.append(s)
`

// serveOnce listens on the rank API's socket in dir, as an agent would,
// for one connection: it reads a line, removes the socket (closes the
// listener), answers reply and closes the connection. It returns the
// line.
func serveOnce(t *testing.T, dir, reply string) string {
	t.Helper()
	l, c, line := accept(t, dir)
	defer c.Close()
	l.Close() // the socket file goes: the next connect finds nothing
	if _, err := os.Lstat(filepath.Join(dir, "rank.sock")); err == nil {
		t.Fatal("the socket file stayed after the listener closed")
	}
	fmt.Fprintln(c, reply)
	return line
}

// accept listens on the rank API's socket in dir and returns the listener,
// the first connection and the line read from it.
func accept(t *testing.T, dir string) (*net.UnixListener, net.Conn, string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "rank.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	_ = l.SetDeadline(time.Now().Add(30 * time.Second))
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("accept on %s: %v", dir, err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read from the container: %v", err)
	}
	return l, c, strings.TrimSpace(line)
}

// hello returns n of the client's "hello n".
func hello(t *testing.T, line string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscanf(line, "hello %d", &n); err != nil {
		t.Fatalf("the container said %q, want hello N", line)
	}
	return n
}

// TestRankAPIDir: a container with the rank API's dir reaches a listener
// of the host's on its socket. CRIU refuses to dump it while the host's
// side is open (a live connection, one in the listener's backlog); once
// the host has closed its side (socket file and connection; the
// connection in the backlog is reset by the listener's close, not
// accepted, and the client keeps it through the checkpoints that follow),
// the container is checkpointed and restored as a copy and in place, and each
// restored process connects again to a new listener at its own dir's
// socket. The dir is the
// container's own: kept across the restore in place, 0700, bound nosuid,
// nodev and noexec, and the only thing of the host the container sees
// under /run; what it writes there stays out of its checkpoints.
func TestRankAPIDir(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in, err := m.Run(ctx, container.Config{Name: "r", Args: []string{"/usr/bin/python3", "-u", "-c", apiClient}, RankAPI: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := m.APIDir("r")
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("API dir %s: %v, %v; want a directory 0700", dir, fi, err)
	}
	// The host's side open: a connection answered and kept, and the
	// client's next one waiting in the backlog.
	l, c, got := accept(t, dir)
	if got != "hello 1" {
		t.Fatalf("the container said %q, want hello 1", got)
	}
	fmt.Fprintln(c, "ok 1")
	waitLog(t, in.Log, 0, "the first reply", func(b []byte) bool { return strings.Contains(string(b), "got 1 ok 1\n") })
	if _, err := m.Checkpoint(ctx, "r", container.CheckpointOptions{}); !errors.Is(err, container.ErrDumpFailed) || !strings.Contains(err.Error(), "unix") {
		t.Fatalf("checkpoint with the host's side open = %v, want ErrDumpFailed for a unix socket", err)
	}
	c.Close()
	l.Close()
	n := hello(t, serveOnce(t, dir, "ok"))
	waitLog(t, in.Log, 0, "the reply", func(b []byte) bool { return strings.Contains(string(b), fmt.Sprintf("got %d ok\n", n)) })

	// What the container sees there and around it.
	if err := os.WriteFile(filepath.Join(dir, "note"), []byte("from the host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got = execOut(t, m, "r", `ls -A /run; ls -A /run/cairn; cat /run/cairn/note; echo mine > /run/cairn/mine
echo "$CAIRN_SOCKET"; grep ' /run/cairn ' /proc/self/mountinfo; ls -A `+env.DataDir+` 2>/dev/null | sed 's/^/LISTED /'`)
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 5 || lines[0] != "cairn" || lines[1] != "note" || lines[2] != "from the host" || lines[3] != rankv1.SocketPath {
		t.Fatalf("inside the container:\n%s\nwant /run holding cairn, /run/cairn holding note, and CAIRN_SOCKET", got)
	}
	if opts := strings.Fields(lines[4]); len(opts) < 6 || !regexp.MustCompile(`(^|,)nosuid(,|$)`).MatchString(opts[5]) ||
		!strings.Contains(opts[5], "nodev") || !strings.Contains(opts[5], "noexec") || !strings.HasPrefix(opts[5], "rw") {
		t.Errorf("/run/cairn is mounted %q, want rw,nosuid,nodev,noexec", lines[4])
	}
	if b, err := os.ReadFile(filepath.Join(dir, "mine")); err != nil || string(b) != "mine\n" {
		t.Errorf("what the container wrote in /run/cairn: %q, %v", b, err)
	}
	os.Remove(filepath.Join(dir, "mine"))

	rec, err := m.Checkpoint(ctx, "r", container.CheckpointOptions{})
	if err != nil {
		t.Fatalf("checkpoint with the host's side closed: %v", err)
	}
	if _, err := m.Repo().ReadDeltaFile(ctx, "r", rec.Seq, "run/cairn/note"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the API dir's file is in the checkpoint: %v", err)
	}

	// A copy, beside the original: a dir of its own, served anew.
	cp, err := m.Restore(ctx, "r", container.RestoreOptions{Seq: rec.Seq, As: "r2"})
	if err != nil {
		t.Fatalf("restore as a copy: %v", err)
	}
	if m.APIDir("r2") == dir {
		t.Fatal("the copy shares the original's API dir")
	}
	if _, err := os.Stat(filepath.Join(m.APIDir("r2"), "note")); err == nil {
		t.Error("the copy's API dir holds the original's file")
	}
	if got := serveOnce(t, m.APIDir("r2"), "ok r2"); got != fmt.Sprintf("hello %d", n+1) {
		t.Fatalf("the copy said %q, want hello %d", got, n+1)
	}
	waitLog(t, cp.Log, 0, "the copy's reply", func(b []byte) bool { return strings.Contains(string(b), fmt.Sprintf("got %d ok r2\n", n+1)) })

	// In place: the same dir, kept.
	if err := m.Kill(ctx, "r", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Wait(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	again, err := m.Restore(ctx, "r", container.RestoreOptions{Seq: rec.Seq})
	if err != nil {
		t.Fatalf("restore in place: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "note")); err != nil || string(b) != "from the host\n" {
		t.Errorf("the API dir was not kept across the restore: %q, %v", b, err)
	}
	if got := serveOnce(t, dir, "ok again"); got != fmt.Sprintf("hello %d", n+1) {
		t.Fatalf("the restored container said %q, want hello %d", got, n+1)
	}
	waitLog(t, again.Log, 0, "the restored reply", func(b []byte) bool { return strings.Contains(string(b), fmt.Sprintf("got %d ok again\n", n+1)) })

	if err := m.Remove(ctx, "r", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the API dir outlived its container: %v", err)
	}
}

// TestRankAPIConfig: what cannot go with the rank API's dir is refused
// before anything is made.
func TestRankAPIConfig(t *testing.T) {
	env := testutil.NewEnv(t)
	host := t.TempDir()
	for _, tc := range []struct {
		name string
		cfg  container.Config
	}{
		{"userns", container.Config{UserNS: true}},
		{"volume over it", container.Config{Volumes: []container.Volume{{Host: host, Path: "/run"}}}},
		{"volume at it", container.Config{Volumes: []container.Volume{{Host: host, Path: rankv1.SocketDir}}}},
		{"volume in it", container.Config{Volumes: []container.Volume{{Host: host, Path: rankv1.SocketDir + "/x"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Name, cfg.Args, cfg.RankAPI = "bad", []string{"true"}, true
			if _, err := env.Manager.Run(context.Background(), cfg); !errors.Is(err, container.ErrBadConfig) {
				t.Fatalf("Run = %v, want ErrBadConfig", err)
			}
		})
	}
}
