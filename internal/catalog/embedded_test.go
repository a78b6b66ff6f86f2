package catalog_test

import (
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"cairn/internal/catalog"
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

	// Same directory, on another port.
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
// server and the client, closes the port and unlocks the directory, even
// with a watch and a membership open.
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

	u, err := url.Parse(e.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Close", u.Host)
	}
	l, err := net.Listen("tcp", u.Host)
	if err != nil {
		t.Fatalf("port not free after Close: %v", err)
	}
	l.Close()

	if fi, err := os.Stat(filepath.Join(dir, "etcd.log")); err != nil || fi.Size() == 0 {
		t.Errorf("etcd.log in the data directory: %v, %v", fi, err)
	}

	// The directory is unlocked: a new server starts on it at once, on the
	// port the first one had.
	e2, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: dir, ClientAddr: u.Host, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("restart on the same directory and port: %v", err)
	}
	if err := e2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestWatchSurvivesRestart: a watch waits while the server is down and
// resumes, missing nothing, when it is back on the same address.
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

	addr := strings.TrimPrefix(e.Endpoints()[0], "http://")
	e2, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: dir, ClientAddr: addr, Logger: testLogger(t)})
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
