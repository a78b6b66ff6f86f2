package catalog_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/cairn-hpc/cairn/internal/catalog"
)

func TestRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	ctx := testContext(t)

	e, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: dir, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := catalog.Open(ctx, catalog.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	want := record{Name: "a", State: "committed", N: 7}
	if err := c.Create(ctx, "ckpts/a/000001", want); err != nil {
		t.Fatal(err)
	}
	rev, err := c.Get(ctx, "ckpts/a/000001", &record{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// Same directory, so the same socket.
	c = open(t, startEmbedded(t, dir))
	var got record
	gotRev, err := c.Get(ctx, "ckpts/a/000001", &got)
	if err != nil {
		t.Fatalf("Get after restart: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" || gotRev != rev {
		t.Fatalf("after restart at revision %d, want %d (-want +got):\n%s", gotRev, rev, diff)
	}
	// And the revision counter goes on from where it was.
	if err := c.Put(ctx, "ckpts/a/000002", want); err != nil {
		t.Fatal(err)
	}
	if r2, _ := c.Get(ctx, "ckpts/a/000002", &got); r2 <= rev {
		t.Fatalf("revision after restart %d, before %d", r2, rev)
	}
}

// TestCloseLeavesNothing checks that Close ends every goroutine of the
// server and the client, removes the socket and unlocks the directory,
// even with a watch and a membership open.
func TestCloseLeavesNothing(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	dir := t.TempDir()
	ctx := testContext(t)

	start := time.Now()
	e, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: dir}) // log to a file
	if err != nil {
		t.Fatal(err)
	}
	started := time.Since(start)
	c, err := catalog.Open(ctx, catalog.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, "jobs/a", record{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	events := c.Watch(ctx, "", 0)
	members := c.WatchAlive(ctx)
	if _, err := c.Register(ctx, "n1", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, members, 5*time.Second)
	nextEvent(t, events, 5*time.Second)

	start = time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	clientClosed := time.Since(start)
	for range events {
	}
	for range members {
	}
	start = time.Now()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("start %v, client close %v, server close %v",
		started.Round(time.Millisecond), clientClosed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	goleak.VerifyNone(t, ignore)

	sock := strings.TrimPrefix(e.Endpoints()[0], "unix://")
	if conn, err := net.DialTimeout("unix", sock, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Close", sock)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket %s after Close: %v", sock, err)
	}

	if fi, err := os.Stat(filepath.Join(dir, "etcd.log")); err != nil || fi.Size() == 0 {
		t.Errorf("etcd.log in the data directory: %v, %v", fi, err)
	}

	// The directory is unlocked: a new server starts on it at once, with
	// the same endpoint.
	e2, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: dir, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("restart on the same directory: %v", err)
	}
	if diff := cmp.Diff(e.Endpoints(), e2.Endpoints()); diff != "" {
		t.Errorf("endpoints after a restart (-before +after):\n%s", diff)
	}
	if err := e2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestWatchSurvivesRestart: a watch waits while the server is down and
// resumes, missing nothing, when it is back on the same directory (and so
// the same socket).
func TestWatchSurvivesRestart(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	e, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: dir, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c := open(t, e)
	events := c.Watch(ctx, "", 0)
	if err := c.Put(ctx, "x", 1); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, events, 5*time.Second)

	start := time.Now()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("server close with a client watching: %v", time.Since(start).Round(time.Millisecond))
	select {
	case ev, ok := <-events:
		t.Fatalf("watch while the server is down: %+v, open %v", ev, ok)
	case <-time.After(500 * time.Millisecond):
	}

	e2, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: dir, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e2.Close() })
	// Written through a second client while the first one may still be
	// reconnecting.
	c2 := open(t, e2)
	if err := c2.Put(ctx, "y", 2); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events, 10*time.Second)
	if ev.Err != nil || ev.Key != "y" {
		t.Fatalf("watch after restart: %+v, want the put of y", ev)
	}
	t.Logf("watch resumed %v after the restart began", time.Since(start).Round(time.Millisecond))
}

func TestStartEmbeddedErrors(t *testing.T) {
	ctx := testContext(t)
	if _, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{}); err == nil {
		t.Fatal("StartEmbedded without Dir succeeded")
	}
	// A second server on a directory in use fails rather than sharing it.
	dir := t.TempDir()
	startEmbedded(t, dir)
	_, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: dir, Logger: testLogger(t)})
	if !errors.Is(err, catalog.ErrLocked) {
		t.Fatalf("second StartEmbedded on the same directory = %v, want ErrLocked", err)
	}
}

func TestOpenUnreachable(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	start := time.Now()
	_, err = catalog.Open(testContext(t), catalog.Config{Endpoints: []string{"http://" + addr}, DialTimeout: 500 * time.Millisecond})
	if err == nil {
		t.Fatal("Open of a closed port succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Open gave up after %v, DialTimeout 500ms", d)
	}
	t.Logf("Open: %v", err)
	goleak.VerifyNone(t, ignore)
}

// TestEmbeddedReachableByOwnerOnly: the embedded etcd opens no TCP port,
// clients or peers; its clients connect through a unix socket in a
// directory of mode 0700, which a process of another user cannot reach
// even where it can reach the directory around it.
func TestEmbeddedReachableByOwnerOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as another user")
	}
	before := tcpListeners(t)
	// Other users may enter base, as they may enter /var/lib.
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e := startEmbedded(t, filepath.Join(base, "etcd"))

	if got := tcpListeners(t); len(got) > len(before) {
		t.Errorf("listening TCP sockets before StartEmbedded %v, after %v", before, got)
	}
	eps := e.Endpoints()
	if len(eps) != 1 || !strings.HasPrefix(eps[0], "unix:///") {
		t.Fatalf("endpoints %q, want one unix socket", eps)
	}
	sock := strings.TrimPrefix(eps[0], "unix://")
	fi, err := os.Stat(filepath.Dir(sock))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
		t.Errorf("socket directory %s: mode %v, owner %d; want 0700 and %d", filepath.Dir(sock), fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, os.Geteuid())
	}

	// The owner is served.
	c := open(t, e)
	ctx := testContext(t)
	if err := c.Put(ctx, "jobs/a", record{Name: "a"}); err != nil {
		t.Fatal(err)
	}

	// Another user reaches a socket of base, but not etcd's.
	control := filepath.Join(base, "control.sock")
	l, err := net.Listen("unix", control)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(control, 0o777); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	if err := dialAs(t, nobody, control); err != nil {
		t.Fatalf("user %d cannot reach a socket open to all: %v", nobody, err)
	}
	err = dialAs(t, nobody, sock)
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("user %d dialling etcd's socket: %v, want permission denied", nobody, err)
	}
}

// dialAs dials the unix socket at path from a process running as uid
// (this test binary again; see TestMain) and returns its error.
func dialAs(t *testing.T, uid uint32, path string) error {
	t.Helper()
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), dialEnv+"="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.Output()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return errors.New(strings.TrimSpace(string(out)))
	default:
		t.Fatalf("run as user %d: %v: %s", uid, err, out)
		return nil
	}
}

// tcpListeners returns the listening TCP sockets (as "local address")
// that this process holds.
func tcpListeners(t *testing.T) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	mine := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			mine[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			f := strings.Fields(line)
			if len(f) >= 10 && f[3] == "0A" && mine[f[9]] {
				out = append(out, f[1])
			}
		}
	}
	return out
}

// TestEmbeddedLongDir: a data directory too deep for a unix socket path
// gets its socket in a private directory of its own, removed by Close.
func TestEmbeddedLongDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	e, err := catalog.StartEmbedded(testContext(t), catalog.EmbeddedOptions{Dir: dir, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	sock := strings.TrimPrefix(e.Endpoints()[0], "unix://")
	c, err := catalog.Open(testContext(t), catalog.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(testContext(t), "x", 1); err != nil {
		t.Fatal(err)
	}
	c.Close()
	fi, err := os.Stat(filepath.Dir(sock))
	if err != nil || fi.Mode().Perm() != 0o700 || strings.HasPrefix(sock, dir) {
		t.Errorf("socket %s: directory %v, %v; want mode 0700 outside %s", sock, fi, err, dir)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(sock)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket directory after Close: %v", err)
	}
}
