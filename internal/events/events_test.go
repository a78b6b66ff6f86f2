package events_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/events"
	"github.com/cairn-hpc/cairn/internal/proc"
)

func types(es []evv1.Event) string {
	var s []string
	for _, e := range es {
		s = append(s, fmt.Sprintf("%d:%s", e.Seq, e.Type))
	}
	return strings.Join(s, " ")
}

func TestHistoryAndFilters(t *testing.T) {
	// A clock that moves a second per reading, so that each event has its
	// own time and the Since cases do not depend on the clock's resolution.
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	ticks := 0
	x, err := events.New(events.Options{Now: func() time.Time {
		ticks++
		return start.Add(time.Duration(ticks) * time.Second)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	x.Publish(evv1.Event{Type: evv1.NodeJoined, Node: "n1"})
	mid := x.Publish(evv1.Event{Type: evv1.CkptCommitted, Job: "a", Ckpt: 1})
	x.Publish(evv1.Event{Type: evv1.CkptDurable, Job: "b", Ckpt: 1})
	last := x.Publish(evv1.Event{Type: evv1.MigrationDone, Job: "a"})
	for _, tc := range []struct {
		f    events.Filter
		want string
	}{
		{events.Filter{}, "1:node.joined 2:checkpoint.committed 3:checkpoint.durable 4:migration.done"},
		{events.Filter{Job: "a"}, "2:checkpoint.committed 4:migration.done"},
		{events.Filter{Type: "checkpoint.*"}, "2:checkpoint.committed 3:checkpoint.durable"},
		{events.Filter{AfterSeq: 2}, "3:checkpoint.durable 4:migration.done"},
		{events.Filter{Since: mid.Time}, "2:checkpoint.committed 3:checkpoint.durable 4:migration.done"},
		{events.Filter{Since: mid.Time.Add(time.Nanosecond)}, "3:checkpoint.durable 4:migration.done"},
		{events.Filter{Job: "a", Since: mid.Time.Add(time.Nanosecond)}, "4:migration.done"},
		{events.Filter{Since: last.Time.Add(time.Nanosecond)}, ""},
	} {
		got := types(x.History(tc.f))
		if got != tc.want {
			t.Errorf("History(%+v) = %q, want %q", tc.f, got, tc.want)
		}
	}
}

// TestLateSubscriber: a subscriber that comes late gets what it missed,
// then new events, in order and without gaps.
func TestLateSubscriber(t *testing.T) {
	x, _ := events.New(events.Options{})
	defer x.Close()
	for i := range 5 {
		x.Publish(evv1.Event{Type: evv1.CkptCommitted, Ckpt: i + 1})
	}
	s := x.Subscribe(events.Filter{AfterSeq: 2}, 16)
	defer s.Cancel()
	go func() {
		for i := range 3 {
			x.Publish(evv1.Event{Type: evv1.CkptDurable, Ckpt: i + 1})
		}
	}()
	var got []uint64
	for len(got) < 6 {
		e, ok := s.Wait(context.Background())
		if !ok {
			t.Fatal("subscription ended")
		}
		got = append(got, e.Seq)
	}
	if fmt.Sprint(got) != "[3 4 5 6 7 8]" {
		t.Fatalf("got %v", got)
	}
}

// TestSlowSubscriberNeverBlocks: publishing goes on when a subscriber does
// not read; the subscriber is cut off and told so.
func TestSlowSubscriberNeverBlocks(t *testing.T) {
	x, _ := events.New(events.Options{})
	defer x.Close()
	s := x.SubscribeNew(events.Filter{}, 4)
	done := make(chan struct{})
	go func() {
		for range 100 {
			x.Publish(evv1.Event{Type: evv1.NodeJoined})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish blocked on a subscriber that does not read")
	}
	n := 0
	for range s.C {
		n++
	}
	if n != 4 || !s.Lagged() {
		t.Fatalf("slow subscriber got %d events, lagged %v; want 4, true", n, s.Lagged())
	}
}

// TestPersistence: the history survives a restart, numbering goes on, and
// the file is trimmed to the kept events.
func TestPersistence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "events.jsonl")
	x, err := events.New(events.Options{File: file, Keep: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		x.Publish(evv1.Event{Type: evv1.CkptCommitted, Ckpt: i + 1})
	}
	x.Close()
	// A line cut short by a crash is skipped.
	f, _ := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":99,"ty`)
	f.Close()
	x, err = events.New(events.Options{File: file, Keep: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if got := types(x.History(events.Filter{})); got != "5:checkpoint.committed 6:checkpoint.committed 7:checkpoint.committed" {
		t.Fatalf("history after restart: %s", got)
	}
	if e := x.Publish(evv1.Event{Type: evv1.NodeLost}); e.Seq != 8 {
		t.Fatalf("next event numbered %d, want 8", e.Seq)
	}
	b, _ := os.ReadFile(file)
	if n := strings.Count(string(b), "\n"); n > 6 {
		t.Fatalf("history file holds %d lines, want at most 2x keep", n)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for " + what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHooks: a command hook that fails twice is retried until it succeeds;
// one that always fails is reported as hook.failed and blocks nothing; an
// HTTP hook gets the event as JSON, and while it is stuck on one the
// publisher goes on; hooks only get the types they match.
func TestHooks(t *testing.T) {
	dir := t.TempDir()
	x, _ := events.New(events.Options{})
	defer x.Close()
	var posted atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") == "application/json" {
			posted.Add(1)
		}
		// The first delivery hangs until the test lets it go.
		once.Do(func() {
			close(entered)
			<-release
		})
	}))
	defer srv.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	flaky := filepath.Join(dir, "tries")
	hooks := []events.Hook{
		// Fails on its first two runs, then records the event type.
		{Pattern: "checkpoint.*", Exec: fmt.Sprintf(`echo x >> %s; [ $(wc -l < %s) -gt 2 ] && echo "$CAIRN_EVENT_TYPE $(cat)" > %s/delivered`, flaky, flaky, dir)},
		{Pattern: evv1.NodeLost, Exec: "echo no >&2; exit 3"},
		{Pattern: "*", URL: srv.URL},
	}
	for _, h := range hooks {
		p, err := events.ParseHook(h.String())
		if err != nil || p != h {
			t.Fatalf("ParseHook(%q) = %+v, %v", h.String(), p, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		events.RunHooks(ctx, x, hooks, events.HookOptions{Attempts: 3, Backoff: 20 * time.Millisecond})
		close(done)
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, "the hooks to subscribe", func() bool { return x.Subscribers() == len(hooks) })
	failed := x.SubscribeNew(events.Filter{Type: evv1.HookFailed}, 16)
	x.Publish(evv1.Event{Type: evv1.NodeJoined, Node: "n1"})
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the HTTP hook never got the first event")
	}
	// The HTTP hook hangs on the first event: publishing goes on.
	published := make(chan struct{})
	go func() {
		x.Publish(evv1.Event{Type: evv1.NodeLost, Node: "n2"})
		x.Publish(evv1.Event{Type: evv1.CkptCommitted, Job: "j", Ckpt: 4})
		close(published)
	}()
	select {
	case <-published:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish waits for a hook stuck on an earlier event")
	}
	close(release)
	waitFor(t, "the flaky hook's delivery", func() bool {
		_, err := os.Stat(filepath.Join(dir, "delivered"))
		return err == nil
	})
	b, _ := os.ReadFile(filepath.Join(dir, "delivered"))
	if !strings.HasPrefix(string(b), "checkpoint.committed {") || !strings.Contains(string(b), `"ckpt":4`) {
		t.Fatalf("hook got %q", b)
	}
	e, ok := failed.Wait(context.Background())
	if !ok || !strings.Contains(e.Message, "after 3 attempts") || !strings.Contains(e.Message, "exit status 3: no") || e.Node != "n2" {
		t.Fatalf("hook failure reported as %+v", e)
	}
	waitFor(t, "the HTTP hook", func() bool { return posted.Load() == 3 })
	if _, err := events.ParseHook("node.lost=ftp://x"); err == nil {
		t.Error("a bad hook target was accepted")
	}
}

// readPID waits for a pid written to file by a command under test, and
// kills it when the test ends if it still runs.
func readPID(t *testing.T, file string) int {
	t.Helper()
	var pid int
	waitFor(t, "the pid in "+file, func() bool {
		b, err := os.ReadFile(file)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	t.Cleanup(func() {
		if proc.Runs(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return pid
}

// TestHookTimeoutKillsGroup: a command hook that outlives its timeout
// is killed with everything it started, even a child that holds its
// output open, and the hook gives up at its timeout rather than when the
// command would end.
func TestHookTimeoutKillsGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	x, _ := events.New(events.Options{})
	defer x.Close()
	hooks := []events.Hook{{Pattern: evv1.NodeLost, Exec: fmt.Sprintf("sleep 600 & echo $! > %s; exec sleep 600", pidFile)}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		events.RunHooks(ctx, x, hooks, events.HookOptions{Attempts: 1, Timeout: time.Second})
		close(done)
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, "the hook to subscribe", func() bool { return x.Subscribers() == len(hooks) })
	failed := x.SubscribeNew(events.Filter{Type: evv1.HookFailed}, 16)
	defer failed.Cancel()
	x.Publish(evv1.Event{Type: evv1.NodeLost, Node: "n1"})
	grandchild := readPID(t, pidFile)
	// Far less than the command's 600 s: only its timeout ends it in time.
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	e, ok := failed.Wait(wctx)
	if !ok {
		t.Fatal("no hook.failed within a minute of a hook with a 1s timeout")
	}
	if !strings.Contains(e.Message, "timed out after 1s") {
		t.Fatalf("the hook gave up with %q, want its timeout", e.Message)
	}
	waitFor(t, "the hook's child to be gone", func() bool { return !proc.Runs(grandchild) })
}

// TestHTTPSHookSigned: an https:// hook whose server's CA is given gets
// every event POSTed with a signature that the receiver checks with the
// shared secret, as docs/security.md tells receivers to; a delivery that
// is altered, signed with another secret or replayed later does not
// verify; a server whose CA is not given is not trusted.
func TestHTTPSHookSigned(t *testing.T) {
	secret := []byte("a shared secret of 32 bytes.....")
	type delivery struct {
		header http.Header
		body   []byte
	}
	got := make(chan delivery, 16)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		// The receiver's side, written from the docs, not with Verify.
		ts := r.Header.Get("X-Cairn-Timestamp")
		sec, err := strconv.ParseInt(ts, 10, 64)
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(ts + "."))
		mac.Write(body)
		want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
		if err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute ||
			!hmac.Equal([]byte(r.Header.Get("X-Cairn-Signature")), []byte(want)) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		got <- delivery{r.Header.Clone(), body}
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes of the stranger's case
	srv.StartTLS()
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())

	run := func(opts events.HookOptions) (*events.Exchange, *events.Subscription) {
		x, _ := events.New(events.Options{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			events.RunHooks(ctx, x, []events.Hook{{Pattern: "checkpoint.*", URL: srv.URL}}, opts)
			close(done)
		}()
		t.Cleanup(func() { cancel(); <-done; x.Close() })
		waitFor(t, "the hook to subscribe", func() bool { return x.Subscribers() == 1 })
		return x, x.SubscribeNew(events.Filter{Type: evv1.HookFailed}, 16)
	}

	x, failed := run(events.HookOptions{Attempts: 1, Secret: secret, RootCAs: roots})
	x.Publish(evv1.Event{Type: evv1.CkptCommitted, Job: "j", Ckpt: 3})
	var d delivery
	select {
	case d = <-got:
	case e := <-failed.C:
		t.Fatalf("signed delivery refused: %s", e.Message)
	case <-time.After(5 * time.Second):
		t.Fatal("no signed delivery within 5s")
	}
	var e evv1.Event
	if err := json.Unmarshal(d.body, &e); err != nil || e.Type != evv1.CkptCommitted || e.Ckpt != 3 {
		t.Fatalf("delivered %s (%v)", d.body, err)
	}

	now := time.Now()
	for _, tc := range []struct {
		name    string
		secret  []byte
		body    []byte
		now     time.Time
		wantErr bool
	}{
		{"as delivered", secret, d.body, now, false},
		{"altered", secret, bytes.Replace(d.body, []byte(`"ckpt":3`), []byte(`"ckpt":4`), 1), now, true},
		{"another secret", []byte("another secret of 32 bytes......"), d.body, now, true},
		{"replayed later", secret, d.body, now.Add(10 * time.Minute), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := events.Verify(tc.secret, d.header, tc.body, tc.now)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Verify = %v, want an error: %v", err, tc.wantErr)
			}
		})
	}

	// Without its CA, the server is a stranger.
	x, failed = run(events.HookOptions{Attempts: 1, Secret: secret})
	x.Publish(evv1.Event{Type: evv1.CkptCommitted, Job: "j", Ckpt: 4})
	select {
	case e := <-failed.C:
		if !strings.Contains(e.Message, "certificate") {
			t.Fatalf("hook to an unknown CA failed with %q, want a certificate error", e.Message)
		}
	case d := <-got:
		t.Fatalf("delivered to a server of an unknown CA: %s", d.body)
	case <-time.After(5 * time.Second):
		t.Fatal("no hook.failed within 5s")
	}
}

// TestHookEnvironment: a hook command gets the event's variables and
// what finds programs, and none of the coordinator's secrets: not the
// hooks' signing secret, not anything else it was started with.
func TestHookEnvironment(t *testing.T) {
	t.Setenv("CAIRN_HOOK_SECRET", "a-secret-of-sixteen-bytes")
	t.Setenv("SOME_TOKEN", "t0ken")
	dir := t.TempDir()
	x, _ := events.New(events.Options{})
	defer x.Close()
	hooks := []events.Hook{{Pattern: "*", Exec: fmt.Sprintf("env > %s/env.tmp; mv %s/env.tmp %s/env", dir, dir, dir)}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		events.RunHooks(ctx, x, hooks, events.HookOptions{Attempts: 1})
		close(done)
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, "the hook to subscribe", func() bool { return x.Subscribers() == 1 })
	x.Publish(evv1.Event{Type: evv1.NodeLost, Node: "n2"})
	waitFor(t, "the hook's run", func() bool {
		_, err := os.Stat(filepath.Join(dir, "env"))
		return err == nil
	})
	b, _ := os.ReadFile(filepath.Join(dir, "env"))
	env := string(b)
	for _, want := range []string{"CAIRN_EVENT_TYPE=" + evv1.NodeLost + "\n", "CAIRN_EVENT_NODE=n2\n", "PATH="} {
		if !strings.Contains(env, want) {
			t.Errorf("hook's environment lacks %q:\n%s", want, env)
		}
	}
	for _, secret := range []string{"a-secret-of-sixteen-bytes", "t0ken"} {
		if strings.Contains(env, secret) {
			t.Errorf("hook's environment holds %q:\n%s", secret, env)
		}
	}
}
