package events

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/proc"
)

// Hook runs for every event whose type matches Pattern: Exec is a shell
// command that gets the event as JSON on stdin (and CAIRN_EVENT_* in its
// environment, with only PATH, HOME, the locale and a few more of the
// coordinator's: see hookEnv), URL an http(s) address the event is POSTed to as JSON,
// signed when HookOptions has a Secret (see Sign). A delivery succeeds
// when the command exits 0 or the URL answers 2xx (redirects are not
// followed). A command runs in a process group of its own: at its timeout,
// and when it ends, whatever is left of its group is killed.
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
	// Secret, if not empty, signs every HTTP delivery (see Sign).
	Secret []byte
	// RootCAs verify the servers of https:// hooks; nil means the
	// system's roots (see HookRoots).
	RootCAs *x509.CertPool
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
	d := &deliverer{secret: opts.Secret, timeout: opts.Timeout, client: &http.Client{
		Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			TLSClientConfig:     &tls.Config{RootCAs: opts.RootCAs, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: opts.Timeout,
			ForceAttemptHTTP2:   true,
		},
		// A hook answers itself: a redirect could send the event
		// elsewhere, or over plain http.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	defer d.client.CloseIdleConnections()
	var wg sync.WaitGroup
	for _, h := range hooks {
		q := &hookQueue{wake: make(chan struct{}, 1), max: opts.Queue}
		wg.Add(2)
		go func() { defer wg.Done(); q.feed(ctx, x, h) }()
		go func() { defer wg.Done(); q.deliver(ctx, x, h, d, opts) }()
	}
	wg.Wait()
}

// deliverer runs hooks: one HTTP client for all of them, the secret that
// signs their POSTs, the timeout of a delivery.
type deliverer struct {
	client  *http.Client
	secret  []byte
	timeout time.Duration
}

// HookRoots returns the system's root CAs plus the certificates of the
// PEM file caFile ("" adds none), to verify https:// hooks with.
func HookRoots(caFile string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if caFile == "" {
		return pool, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("hook CA: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("hook CA %s: no PEM certificate in it", caFile)
	}
	return pool, nil
}

// The headers of a signed HTTP delivery.
const (
	// TimestampHeader is when the delivery was signed, in seconds since
	// the Unix epoch.
	TimestampHeader = "X-Cairn-Timestamp"
	// SignatureHeader is Sign's result.
	SignatureHeader = "X-Cairn-Signature"
	// MaxSignatureAge is how far from the receiver's clock Verify accepts
	// a timestamp.
	MaxSignatureAge = 5 * time.Minute
)

// Sign returns the signature of a delivery of body signed at timestamp
// (TimestampHeader's value): "sha256=" and the hex HMAC-SHA256 under
// secret of the timestamp, a dot and the body. Every attempt is signed
// afresh; a receiver that drops timestamps older than a few minutes and
// event numbers (the body's "seq") it has already taken within them
// cannot be fed a replay.
func Sign(secret []byte, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// ErrBadSignature is returned by Verify for a delivery that is not signed
// with the secret, or was signed too long ago.
var ErrBadSignature = errors.New("bad hook signature")

// Verify checks, for a receiver of hooks written in Go, that a delivery
// (its headers and body) is signed with secret within MaxSignatureAge of
// now.
func Verify(secret []byte, h http.Header, body []byte, now time.Time) error {
	ts := h.Get(TimestampHeader)
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: timestamp %q", ErrBadSignature, ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > MaxSignatureAge || d < -MaxSignatureAge {
		return fmt.Errorf("%w: signed %s from now", ErrBadSignature, d.Round(time.Second))
	}
	if !hmac.Equal([]byte(h.Get(SignatureHeader)), []byte(Sign(secret, ts, body))) {
		return ErrBadSignature
	}
	return nil
}

// hookQueue is a bounded queue that drops its oldest events when full.
type hookQueue struct {
	mu      sync.Mutex
	events  []evv1.Event
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
			if e.Type == evv1.HookFailed {
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

func (q *hookQueue) deliver(ctx context.Context, x *Exchange, h Hook, d *deliverer, opts HookOptions) {
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
				x.Publish(evv1.Event{Type: evv1.HookFailed, Message: fmt.Sprintf("hook %s: queue full, %d events dropped", h, n)})
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
				if err = d.run(ctx, h, e); err == nil || ctx.Err() != nil {
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
				x.Publish(evv1.Event{Type: evv1.HookFailed, Job: e.Job, Node: e.Node,
					Message: fmt.Sprintf("hook %s gave up on event %d (%s) after %d attempts: %v", h, e.Seq, e.Type, opts.Attempts, err)})
			}
		}
	}
}

// run delivers one event to h once.
func (d *deliverer) run(ctx context.Context, h Hook, e evv1.Event) error {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	body, _ := json.Marshal(e)
	if h.URL != "" {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if len(d.secret) > 0 {
			ts := strconv.FormatInt(time.Now().Unix(), 10)
			req.Header.Set(TimestampHeader, ts)
			req.Header.Set(SignatureHeader, Sign(d.secret, ts, body))
		}
		resp, err := d.client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%s answered %s", h.URL, resp.Status)
		}
		return nil
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", h.Exec)
	cmd.Stdin = bytes.NewReader(body)
	cmd.Env = append(hookEnv(os.Environ()),
		"CAIRN_EVENT_TYPE="+e.Type, "CAIRN_EVENT_SEQ="+strconv.FormatUint(e.Seq, 10),
		"CAIRN_EVENT_JOB="+e.Job, "CAIRN_EVENT_NODE="+e.Node)
	out, err := proc.RunGroup(cmd)
	if err != nil && ctx.Err() == context.DeadlineExceeded {
		return fmt.Errorf("timed out after %s", d.timeout)
	}
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

// HookConfig checks the hooks of a coordinator as its flags give them:
// specs (--hook), the file of the secret that signs HTTP hooks
// (--hook-secret-file; its content without a final newline), else
// envSecret ($CAIRN_HOOK_SECRET), and the CA file that verifies https://
// hooks (--hook-ca). A secret, if any, has at least 16 bytes.
func HookConfig(specs []string, secretFile, envSecret, ca string) (hooks []Hook, secret []byte, roots *x509.CertPool, err error) {
	for _, spec := range specs {
		h, err := ParseHook(spec)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--hook: %w", err)
		}
		hooks = append(hooks, h)
	}
	s := envSecret
	if secretFile != "" {
		b, err := os.ReadFile(secretFile)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--hook-secret-file: %w", err)
		}
		s = strings.TrimRight(string(b), "\r\n")
	}
	if s != "" && len(s) < 16 {
		return nil, nil, nil, errors.New("the hook secret is shorter than 16 bytes")
	}
	if s != "" {
		secret = []byte(s)
	}
	if roots, err = HookRoots(ca); err != nil {
		return nil, nil, nil, fmt.Errorf("--hook-ca: %w", err)
	}
	return hooks, secret, roots, nil
}

// hookEnv is what a hook command gets of the coordinator's environment:
// what finds programs and speaks the locale, and nothing else. The rest
// of it holds the coordinator's own settings and secrets
// ($CAIRN_HOOK_SECRET, a token an operator exported), which a command
// that reads an event has no need of; a hook that needs a variable sets
// it in its command.
func hookEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "HOME", k == "USER", k == "LOGNAME", k == "SHELL", k == "TZ", k == "TMPDIR", k == "LANG",
			strings.HasPrefix(k, "LC_"):
			out = append(out, kv)
		}
	}
	return out
}
