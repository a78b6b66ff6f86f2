package events

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "cairn/api/events/v1"
)

// Hook runs for every event whose type matches Pattern: Exec is a shell
// command that gets the event as JSON on stdin (and CAIRN_EVENT_* in its
// environment), URL an http(s) address the event is POSTed to as JSON.
// A delivery succeeds when the command exits 0 or the URL answers 2xx.
type Hook struct {
	Pattern string
	Exec    string
	URL     string
}

// String is the hook as ParseHook reads it.
func (h Hook) String() string {
	if h.URL != "" {
		return h.Pattern + "=" + h.URL
	}
	return h.Pattern + "=exec:" + h.Exec
}

// ParseHook reads "PATTERN=exec:COMMAND" or "PATTERN=http(s)://URL".
func ParseHook(s string) (Hook, error) {
	pattern, target, ok := strings.Cut(s, "=")
	if !ok || pattern == "" || target == "" {
		return Hook{}, fmt.Errorf("hook %q: want TYPE=exec:COMMAND or TYPE=http://URL", s)
	}
	if strings.ContainsAny(pattern, " \t") || (strings.Contains(pattern, "*") && pattern != "*" && !strings.HasSuffix(pattern, ".*")) {
		return Hook{}, fmt.Errorf("hook %q: the type is a type (checkpoint.committed), a family (checkpoint.*) or *", s)
	}
	switch {
	case strings.HasPrefix(target, "exec:") && len(target) > len("exec:"):
		return Hook{Pattern: pattern, Exec: strings.TrimPrefix(target, "exec:")}, nil
	case strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://"):
		return Hook{Pattern: pattern, URL: target}, nil
	}
	return Hook{}, fmt.Errorf("hook %q: the target is exec:COMMAND or an http(s) URL", s)
}

// HookOptions tune RunHooks.
type HookOptions struct {
	// Attempts per event (default 4), with Backoff doubling between them
	// (default 500 ms).
	Attempts int
	Backoff  time.Duration
	// Timeout of one delivery (default 10 s).
	Timeout time.Duration
	// Queue bounds the events waiting for one hook (default 256); past
	// it the oldest are dropped and reported.
	Queue int
}

// RunHooks delivers the events published on x to hooks until ctx is done.
// Every hook has its own queue and goroutine, so a slow or failing hook
// delays no other and never the publisher. A delivery that fails is
// retried; one that fails every attempt, or events dropped from a full
// queue, are published as HookFailed events (which hooks never receive
// for themselves, so a failing hook cannot feed on its own failures).
func RunHooks(ctx context.Context, x *Exchange, hooks []Hook, opts HookOptions) {
	if opts.Attempts <= 0 {
		opts.Attempts = 4
	}
	if opts.Backoff <= 0 {
		opts.Backoff = 500 * time.Millisecond
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.Queue <= 0 {
		opts.Queue = 256
	}
	var wg sync.WaitGroup
	for _, h := range hooks {
		q := &hookQueue{wake: make(chan struct{}, 1), max: opts.Queue}
		wg.Add(2)
		go func() { defer wg.Done(); q.feed(ctx, x, h) }()
		go func() { defer wg.Done(); q.deliver(ctx, x, h, opts) }()
	}
	wg.Wait()
}

// hookQueue is a bounded queue that drops its oldest events when full.
type hookQueue struct {
	mu      sync.Mutex
	events  []v1.Event
	dropped int
	max     int
	wake    chan struct{}
}

// feed subscribes to the events the hook matches, from now on. A
// subscription cut off for lagging is taken up again from the last event
// it delivered, out of the history, so no event is skipped.
func (q *hookQueue) feed(ctx context.Context, x *Exchange, h Hook) {
	s := x.SubscribeNew(Filter{Type: h.Pattern}, 1024)
	last := s.s.filter.AfterSeq
	for ctx.Err() == nil {
		for {
			e, ok := s.Wait(ctx)
			if !ok {
				break
			}
			last = e.Seq
			if e.Type == v1.HookFailed {
				continue
			}
			q.mu.Lock()
			q.events = append(q.events, e)
			if len(q.events) > q.max {
				q.events = q.events[1:]
				q.dropped++
			}
			q.mu.Unlock()
			select {
			case q.wake <- struct{}{}:
			default:
			}
		}
		s.Cancel()
		s = x.Subscribe(Filter{Type: h.Pattern, AfterSeq: last}, 1024)
	}
	s.Cancel()
}

func (q *hookQueue) deliver(ctx context.Context, x *Exchange, h Hook, opts HookOptions) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
		}
		for {
			q.mu.Lock()
			if q.dropped > 0 {
				n := q.dropped
				q.dropped = 0
				q.mu.Unlock()
				x.Publish(v1.Event{Type: v1.HookFailed, Message: fmt.Sprintf("hook %s: queue full, %d events dropped", h, n)})
				continue
			}
			if len(q.events) == 0 {
				q.mu.Unlock()
				break
			}
			e := q.events[0]
			q.events = q.events[1:]
			q.mu.Unlock()
			var err error
			backoff := opts.Backoff
			for attempt := 1; attempt <= opts.Attempts; attempt++ {
				if err = h.run(ctx, e, opts.Timeout); err == nil || ctx.Err() != nil {
					break
				}
				x.log.Warn("hook failed", "hook", h.String(), "event", e.Seq, "attempt", attempt, "err", err)
				if attempt < opts.Attempts {
					select {
					case <-ctx.Done():
					case <-time.After(backoff):
					}
					backoff *= 2
				}
			}
			if err != nil && ctx.Err() == nil {
				x.Publish(v1.Event{Type: v1.HookFailed, Job: e.Job, Node: e.Node,
					Message: fmt.Sprintf("hook %s gave up on event %d (%s) after %d attempts: %v", h, e.Seq, e.Type, opts.Attempts, err)})
			}
		}
	}
}

// run delivers one event once.
func (h Hook) run(ctx context.Context, e v1.Event, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, _ := json.Marshal(e)
	if h.URL != "" {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%s answered %s", h.URL, resp.Status)
		}
		return nil
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", h.Exec)
	cmd.Stdin = bytes.NewReader(body)
	cmd.Env = append(os.Environ(),
		"CAIRN_EVENT_TYPE="+e.Type, "CAIRN_EVENT_SEQ="+strconv.FormatUint(e.Seq, 10),
		"CAIRN_EVENT_JOB="+e.Job, "CAIRN_EVENT_NODE="+e.Node)
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		if msg != "" {
			return fmt.Errorf("%w: %s", err, msg)
		}
		return err
	}
	return nil
}
