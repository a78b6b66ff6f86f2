package events_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "cairn/api/events/v1"
	"cairn/internal/events"
)

func types(es []v1.Event) string {
	var s []string
	for _, e := range es {
		s = append(s, fmt.Sprintf("%d:%s", e.Seq, e.Type))
	}
	return strings.Join(s, " ")
}

func TestHistoryAndFilters(t *testing.T) {
	x, err := events.New(events.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	x.Publish(v1.Event{Type: v1.NodeJoined, Node: "n1"})
	mid := x.Publish(v1.Event{Type: v1.CkptCommitted, Job: "a", Ckpt: 1})
	x.Publish(v1.Event{Type: v1.CkptDurable, Job: "b", Ckpt: 1})
	x.Publish(v1.Event{Type: v1.MigrationDone, Job: "a"})
	for _, tc := range []struct {
		f    events.Filter
		want string
	}{
		{events.Filter{}, "1:node.joined 2:checkpoint.committed 3:checkpoint.durable 4:migration.done"},
		{events.Filter{Job: "a"}, "2:checkpoint.committed 4:migration.done"},
		{events.Filter{Type: "checkpoint.*"}, "2:checkpoint.committed 3:checkpoint.durable"},
		{events.Filter{AfterSeq: 2}, "3:checkpoint.durable 4:migration.done"},
		{events.Filter{Since: mid.Time.Add(time.Nanosecond)}, ""},
	} {
		got := types(x.History(tc.f))
		if tc.f.Since.IsZero() && got != tc.want {
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
		x.Publish(v1.Event{Type: v1.CkptCommitted, Ckpt: i + 1})
	}
	s := x.Subscribe(events.Filter{AfterSeq: 2}, 16)
	defer s.Cancel()
	go func() {
		for i := range 3 {
			x.Publish(v1.Event{Type: v1.CkptDurable, Ckpt: i + 1})
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
			x.Publish(v1.Event{Type: v1.NodeJoined})
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
		x.Publish(v1.Event{Type: v1.CkptCommitted, Ckpt: i + 1})
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
	if e := x.Publish(v1.Event{Type: v1.NodeLost}); e.Seq != 8 {
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
// HTTP hook gets the event as JSON; hooks only get the types they match.
func TestHooks(t *testing.T) {
	dir := t.TempDir()
	x, _ := events.New(events.Options{})
	defer x.Close()
	var posted atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") == "application/json" {
			posted.Add(1)
		}
	}))
	defer srv.Close()
	flaky := filepath.Join(dir, "tries")
	hooks := []events.Hook{
		// Fails on its first two runs, then records the event type.
		{Pattern: "checkpoint.*", Exec: fmt.Sprintf(`echo x >> %s; [ $(wc -l < %s) -gt 2 ] && echo "$CAIRN_EVENT_TYPE $(cat)" > %s/delivered`, flaky, flaky, dir)},
		{Pattern: v1.NodeLost, Exec: "echo no >&2; exit 3"},
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
	time.Sleep(50 * time.Millisecond) // the hooks subscribe
	failed := x.SubscribeNew(events.Filter{Type: v1.HookFailed}, 16)
	start := time.Now()
	x.Publish(v1.Event{Type: v1.NodeLost, Node: "n2"})
	x.Publish(v1.Event{Type: v1.CkptCommitted, Job: "j", Ckpt: 4})
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("publishing took %s: hooks block the publisher", d)
	}
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
	waitFor(t, "the HTTP hook", func() bool { return posted.Load() >= 2 })
	if _, err := events.ParseHook("node.lost=ftp://x"); err == nil {
		t.Error("a bad hook target was accepted")
	}
}
