package rankclient_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/rankclient"
	"github.com/cairn-hpc/cairn/internal/rankclient/ranktest"
)

func newServer(t *testing.T, cfg ranktest.Config) (*ranktest.Server, *rankclient.Client) {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := ranktest.New(t, cfg)
	c := rankclient.New()
	c.Path = s.Path()
	return s, c
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// clock is a settable clock for the event rate limit.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestRankInfo(t *testing.T) {
	_, c := newServer(t, ranktest.Config{Job: "sim", Rank: 2, Size: 4, Ckpt: 3})
	got, err := c.Info(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	want := rankclient.Info{Job: "sim", Rank: 2, Size: 4, Mode: "transparent", Ckpt: 3, Incarnation: 1}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("info (-want +got):\n%s", d)
	}
	if s := got.String(); s != "job=sim rank=2 size=4 mode=transparent ckpt=3 restored=false restored_from=0 incarnation=1" {
		t.Errorf("info shown as %q", s)
	}
}

// TestRankForbidden: naming the rank's own job is fine, another is
// refused, whatever the request.
func TestRankForbidden(t *testing.T) {
	s, c := newServer(t, ranktest.Config{Job: "sim"})
	ctx := testContext(t)
	c.Job = "sim"
	if _, err := c.Info(ctx); err != nil {
		t.Fatalf("info naming its own job: %v", err)
	}
	c.Job = "other"
	_, err := c.Info(ctx)
	var e *rankclient.Error
	if !errors.Is(err, rankclient.ErrForbidden) || !errors.As(err, &e) || e.Code != "forbidden" || !strings.Contains(e.Message, "other") {
		t.Errorf("info of another job: %v", err)
	}
	if _, err := c.Checkpoint(ctx, false); !errors.Is(err, rankclient.ErrForbidden) {
		t.Errorf("checkpoint of another job: %v", err)
	}
	if err := c.Event(ctx, "k", "m"); !errors.Is(err, rankclient.ErrForbidden) {
		t.Errorf("event of another job: %v", err)
	}
	if err := c.Watch(ctx, rankclient.Watcher{}); !errors.Is(err, rankclient.ErrForbidden) {
		t.Errorf("watch of another job: %v", err)
	}
	if errors.Is(err, rankclient.ErrNotFound) {
		t.Error("a forbidden error is also not found")
	}
	if tr := s.Trace(); len(tr) != 0 {
		t.Errorf("refused requests did %v", tr)
	}
}

// TestRankCheckpoint: each outcome of a round, as Checkpoint returns it,
// and where the rank stands after it.
func TestRankCheckpoint(t *testing.T) {
	tests := []struct {
		outcome ranktest.Outcome
		want    rankclient.Result
		err     error
		info    rankclient.Info
		trace   string
	}{
		{ranktest.Done, rankclient.Result{State: "done", Ckpt: 4}, nil,
			rankclient.Info{Job: "sim", Size: 4, Mode: "transparent", Ckpt: 4, Incarnation: 1},
			"checkpoint,round 4,freeze,commit 4,thaw"},
		{ranktest.Restored, rankclient.Result{State: "restored", RestoredFrom: 4}, nil,
			rankclient.Info{Job: "sim", Size: 4, Mode: "transparent", Ckpt: 4, Restored: true, RestoredFrom: 4, Incarnation: 2},
			"checkpoint,round 4,freeze,commit 4,restore 4,thaw"},
		{ranktest.Aborted, rankclient.Result{}, rankclient.ErrAborted,
			rankclient.Info{Job: "sim", Size: 4, Mode: "transparent", Ckpt: 3, Incarnation: 1},
			"checkpoint,round 4,freeze,abort 4,thaw"},
		{ranktest.Conflict, rankclient.Result{}, rankclient.ErrConflict,
			rankclient.Info{Job: "sim", Size: 4, Mode: "transparent", Ckpt: 3, Incarnation: 1},
			"checkpoint"},
	}
	for _, tc := range tests {
		t.Run(tc.outcome.String(), func(t *testing.T) {
			s, c := newServer(t, ranktest.Config{Ckpt: 3})
			ctx := testContext(t)
			s.Next(tc.outcome)
			got, err := c.Checkpoint(ctx, false)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("checkpoint: %v; want %v", err, tc.err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("result (-want +got):\n%s", d)
			}
			info, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.info, info); d != "" {
				t.Errorf("info after (-want +got):\n%s", d)
			}
			if tr := strings.Join(s.Trace(), ","); tr != tc.trace {
				t.Errorf("trace %s, want %s", tr, tc.trace)
			}
		})
	}
}

// TestRankReplyLost: a checkpoint or an event whose connection closes
// before its reply, after the endpoint carried it out, is sent again with
// its id and answered from the first: one checkpoint asked for, one event
// published.
func TestRankReplyLost(t *testing.T) {
	s, c := newServer(t, ranktest.Config{Ckpt: 3})
	ctx := testContext(t)
	s.LoseReply("checkpoint")
	s.LoseReply("event")
	got, err := c.Checkpoint(ctx, false)
	if err != nil || got != (rankclient.Result{State: "done", Ckpt: 4}) {
		t.Fatalf("checkpoint: %+v, %v", got, err)
	}
	if err := c.Event(ctx, "phase", "step 1"); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]ranktest.Event{{Kind: "phase", Message: "step 1"}}, s.Events()); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
	var asked, repeats int
	for _, e := range s.Trace() {
		switch e {
		case "checkpoint":
			asked++
		case "repeat checkpoint", "repeat event":
			repeats++
		}
	}
	if asked != 1 || repeats != 2 {
		t.Errorf("trace %s: want one checkpoint asked for, and both requests repeated", strings.Join(s.Trace(), ","))
	}
}

// TestRankStop: stop is a checkpoint with stop set.
func TestRankStop(t *testing.T) {
	s, c := newServer(t, ranktest.Config{})
	res, err := c.Checkpoint(testContext(t), true)
	if err != nil || res.State != "done" || res.Ckpt != 1 {
		t.Fatalf("stop: %+v, %v", res, err)
	}
	if tr := s.Trace(); len(tr) == 0 || tr[0] != "checkpoint stop" {
		t.Errorf("trace %v: want a checkpoint with stop first", tr)
	}
}

// TestRankEvents: the job's rate limit (bursts of 20, 10 a second) and
// the bounds of kind and message; what is published arrives as it was
// sent.
func TestRankEvents(t *testing.T) {
	clk := &clock{now: time.Unix(1e9, 0)}
	s, c := newServer(t, ranktest.Config{Now: clk.Now})
	ctx := testContext(t)
	var want []ranktest.Event
	for i := range 20 {
		msg := fmt.Sprintf("step %d: \"quoted\"\n\ttabbed \\ é ✓ \x01", i)
		if err := c.Event(ctx, "phase.step-x_1", msg); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		want = append(want, ranktest.Event{Kind: "phase.step-x_1", Message: msg})
	}
	if err := c.Event(ctx, "phase", "one too many"); !errors.Is(err, rankclient.ErrRateLimited) {
		t.Fatalf("21st event at once: %v; want rate limited", err)
	}
	clk.Add(time.Second)
	for i := range 10 {
		if err := c.Event(ctx, "k", strings.Repeat("m", 1024)); err != nil {
			t.Fatalf("event %d a second later: %v", i, err)
		}
		want = append(want, ranktest.Event{Kind: "k", Message: strings.Repeat("m", 1024)})
	}
	if err := c.Event(ctx, "phase", "one too many"); !errors.Is(err, rankclient.ErrRateLimited) {
		t.Fatalf("11th event a second later: %v; want rate limited", err)
	}
	clk.Add(time.Hour)
	for _, tc := range []struct{ kind, msg string }{
		{"", "no kind"}, {"a b", "space"}, {strings.Repeat("k", 33), "long kind"}, {"k", strings.Repeat("m", 1025)},
	} {
		if err := c.Event(ctx, tc.kind, tc.msg); !errors.Is(err, rankclient.ErrBadRequest) {
			t.Errorf("event %q %.20q: %v; want bad request", tc.kind, tc.msg, err)
		}
	}
	if d := cmp.Diff(want, s.Events()); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
}

// TestRankAway: a client waits while the socket is not there, and gives
// up at once when its directory is not there either.
func TestRankAway(t *testing.T) {
	dir, err := os.MkdirTemp("", "rank")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := rankclient.New()
	c.Path = filepath.Join(dir, "rank.sock")
	type reply struct {
		info rankclient.Info
		err  error
	}
	done := make(chan reply, 1)
	go func() {
		i, err := c.Info(testContext(t))
		done <- reply{i, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("info without a socket returned %+v, %v", r.info, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	ranktest.New(t, ranktest.Config{Dir: dir, Job: "late"})
	select {
	case r := <-done:
		if r.err != nil || r.info.Job != "late" {
			t.Fatalf("info once the socket is there: %+v, %v", r.info, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("info did not return once the socket was there")
	}

	c.Path = filepath.Join(dir, "gone", "rank.sock")
	start := time.Now()
	if _, err := c.Info(testContext(t)); !errors.Is(err, rankclient.ErrNoEndpoint) {
		t.Errorf("info without a socket directory: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("no endpoint took %s to say so", time.Since(start))
	}
}

// calls records callbacks in order and says when there are n.
type calls struct {
	mu   sync.Mutex
	list []string
}

func (c *calls) add(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.list = append(c.list, fmt.Sprintf(format, args...))
}

// wait waits until there are n calls and returns them.
func (c *calls) wait(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		got := append([]string(nil), c.list...)
		c.mu.Unlock()
		if len(got) >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRankWatch: prepare before every round, then resumed (taken or
// aborted) or restored, as the watch replies before and after say.
func TestRankWatch(t *testing.T) {
	s, c := newServer(t, ranktest.Config{Ckpt: 3})
	ctx, cancel := context.WithCancel(testContext(t))
	var got calls
	var fail atomic.Bool
	registered := make(chan struct{}, 10)
	watched := make(chan error, 1)
	go func() {
		watched <- c.Watch(ctx, rankclient.Watcher{
			DeadlineMS: 2000,
			Prepare: func(ckpt int, mode string) error {
				got.add("prepare %d %s", ckpt, mode)
				if fail.Load() {
					return errors.New("cannot flush")
				}
				return nil
			},
			Resumed:  func(ckpt int) { got.add("resumed %d", ckpt) },
			Restored: func(from int) { got.add("restored %d", from) },
			Watching: func(rankclient.Info) { registered <- struct{}{} },
		})
	}()
	<-registered
	steps := []struct {
		outcome ranktest.Outcome
		fail    bool
		want    []string
	}{
		{ranktest.Done, false, []string{"prepare 4 transparent", "resumed 4"}},
		{ranktest.Aborted, false, []string{"prepare 5 transparent", "resumed 4"}},
		{ranktest.Done, true, []string{"prepare 5 transparent", "resumed 4"}},
		{ranktest.Restored, false, []string{"prepare 5 transparent", "restored 5"}},
	}
	var want []string
	for _, st := range steps {
		fail.Store(st.fail)
		if err := s.Checkpoint(st.outcome); err != nil {
			t.Fatal(err)
		}
		<-registered // watching again
		want = append(want, st.want...)
		if d := cmp.Diff(want, got.wait(t, len(want))); d != "" {
			t.Fatalf("after a round %s (prepare failing: %t), calls (-want +got):\n%s", st.outcome, st.fail, d)
		}
	}
	wantTrace := "round 4,prepare 4,ready,freeze,commit 4,thaw," +
		"round 5,prepare 5,ready,freeze,abort 5,thaw," +
		"round 5,prepare 5,no ready,freeze,abort 5,thaw," +
		"round 5,prepare 5,ready,freeze,commit 5,restore 5,thaw"
	if tr := strings.Join(s.Trace(), ","); tr != wantTrace {
		t.Errorf("trace %s\nwant %s", tr, wantTrace)
	}
	cancel()
	if err := <-watched; !errors.Is(err, context.Canceled) {
		t.Errorf("watch ended with %v", err)
	}
}

// TestRankAppMode: in application-level mode a round aborts unless the
// rank watches.
func TestRankAppMode(t *testing.T) {
	_, c := newServer(t, ranktest.Config{Mode: "app"})
	ctx := testContext(t)
	if _, err := c.Checkpoint(ctx, false); !errors.Is(err, rankclient.ErrAborted) || !strings.Contains(err.Error(), "not watching") {
		t.Fatalf("checkpoint of an app job nobody watches: %v", err)
	}
	var got calls
	registered := make(chan struct{}, 10)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go c.Watch(wctx, rankclient.Watcher{
		Prepare:  func(ckpt int, mode string) error { got.add("save %d %s", ckpt, mode); return nil },
		Watching: func(rankclient.Info) { registered <- struct{}{} },
	})
	<-registered
	res, err := c.Checkpoint(ctx, false)
	if err != nil || res.Ckpt != 1 {
		t.Fatalf("checkpoint of an app job watched: %+v, %v", res, err)
	}
	if d := cmp.Diff([]string{"save 1 app"}, got.wait(t, 1)); d != "" {
		t.Errorf("prepare calls (-want +got):\n%s", d)
	}
}

// TestRankCommand: the words of cairn rank.
func TestRankCommand(t *testing.T) {
	s, c := newServer(t, ranktest.Config{Job: "sim", Rank: 1, Ckpt: 2})
	ctx := testContext(t)
	for _, tc := range []struct {
		args []string
		out  string
		err  error
	}{
		{[]string{"info"}, "job=sim rank=1 size=4 mode=transparent ckpt=2 restored=false restored_from=0 incarnation=1", nil},
		{[]string{"checkpoint"}, "checkpoint 3 done", nil},
		{[]string{"stop"}, "checkpoint 4 done", nil},
		{[]string{"event", "phase", "half way"}, "published phase", nil},
		{[]string{"event", "bad kind", "x"}, "", rankclient.ErrBadRequest},
		{[]string{"event", "phase"}, "", rankclient.ErrUsage},
		{[]string{"reboot"}, "", rankclient.ErrUsage},
		{nil, "", rankclient.ErrUsage},
	} {
		out, err := rankclient.Command(ctx, c, tc.args)
		if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
			t.Errorf("%q: %v; want %v", tc.args, err, tc.err)
			continue
		}
		if err == nil && out.String() != tc.out {
			t.Errorf("%q: %q; want %q", tc.args, out, tc.out)
		}
	}
	if d := cmp.Diff([]ranktest.Event{{Kind: "phase", Message: "half way"}}, s.Events()); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
}
