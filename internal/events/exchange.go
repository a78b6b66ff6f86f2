package events

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/durable"
)

// DefaultKeep is how many events the history keeps.
const DefaultKeep = 10000

// Options configure an Exchange.
type Options struct {
	// File keeps the history across restarts (JSON lines); "" keeps it in
	// memory only.
	File string
	// Keep bounds the history; 0 means DefaultKeep.
	Keep   int
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Exchange numbers, keeps and delivers events. Its methods are safe for
// concurrent use.
type Exchange struct {
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	hist    []evv1.Event // oldest first, at most opts.Keep
	next    uint64
	subs    map[*sub]struct{}
	f       *os.File
	written int // lines in the file
}

type sub struct {
	ch     chan evv1.Event
	filter Filter
	lagged bool
}

// Filter selects events: by job (empty: any), by type pattern (empty:
// any) and by sequence number (after AfterSeq) or time (not before
// Since).
type Filter struct {
	Job      string
	Type     string
	AfterSeq uint64
	Since    time.Time
}

func (f Filter) match(e evv1.Event) bool {
	if f.Job != "" && e.Job != f.Job {
		return false
	}
	if f.Type != "" && !evv1.Match(f.Type, e.Type) {
		return false
	}
	return e.Seq > f.AfterSeq && !e.Time.Before(f.Since)
}

// New opens an Exchange, loading the history kept in opts.File.
func New(opts Options) (*Exchange, error) {
	if opts.Keep <= 0 {
		opts.Keep = DefaultKeep
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	x := &Exchange{opts: opts, log: opts.Logger, subs: map[*sub]struct{}{}, next: 1}
	if x.log == nil {
		x.log = slog.New(slog.DiscardHandler)
	}
	if opts.File == "" {
		return x, nil
	}
	if b, err := os.ReadFile(opts.File); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e evv1.Event
			if json.Unmarshal(sc.Bytes(), &e) != nil || e.Seq < x.next {
				continue // a line cut short by a crash, or out of order
			}
			x.hist = append(x.hist, e)
			x.next = e.Seq + 1
			x.written++
		}
		if len(x.hist) > opts.Keep {
			x.hist = x.hist[len(x.hist)-opts.Keep:]
		}
	} else if !os.IsNotExist(err) {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(opts.File), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(opts.File, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	x.f = f
	return x, nil
}

// Close stops every subscription and closes the history file.
func (x *Exchange) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	for s := range x.subs {
		close(s.ch)
		delete(x.subs, s)
	}
	if x.f != nil {
		err := x.f.Close()
		x.f = nil
		return err
	}
	return nil
}

// Publish numbers and timestamps e, keeps it and hands it to every
// matching subscriber. It never blocks: a subscriber whose buffer is full
// is cut off (its channel closed; Lagged tells it why).
func (x *Exchange) Publish(e evv1.Event) evv1.Event {
	x.mu.Lock()
	defer x.mu.Unlock()
	e.Seq = x.next
	x.next++
	if e.Time.IsZero() {
		e.Time = x.opts.Now().UTC()
	}
	x.hist = append(x.hist, e)
	if len(x.hist) > x.opts.Keep {
		x.hist = append(x.hist[:0:0], x.hist[len(x.hist)-x.opts.Keep:]...)
	}
	x.persistLocked(e)
	for s := range x.subs {
		if !s.filter.match(e) {
			continue
		}
		select {
		case s.ch <- e:
		default:
			s.lagged = true
			close(s.ch)
			delete(x.subs, s)
		}
	}
	return e
}

// persistLocked appends e to the history file, rewriting the file with
// only the kept events once it holds twice as many lines.
func (x *Exchange) persistLocked(e evv1.Event) {
	if x.f == nil {
		return
	}
	b, _ := json.Marshal(e)
	if _, err := x.f.Write(append(b, '\n')); err != nil {
		x.log.Warn("event history", "err", err)
		return
	}
	x.written++
	if x.written < 2*x.opts.Keep {
		return
	}
	var buf bytes.Buffer
	for _, h := range x.hist {
		b, _ := json.Marshal(h)
		buf.Write(append(b, '\n'))
	}
	if err := durable.WriteFile(x.opts.File, buf.Bytes(), 0o600); err != nil {
		x.log.Warn("event history", "err", err)
		return
	}
	f, err := os.OpenFile(x.opts.File, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		x.log.Warn("event history", "err", err)
		return
	}
	x.f.Close()
	x.f, x.written = f, len(x.hist)
}

// History returns the kept events that match f, oldest first.
func (x *Exchange) History(f Filter) []evv1.Event {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.historyLocked(f)
}

func (x *Exchange) historyLocked(f Filter) []evv1.Event {
	var out []evv1.Event
	for _, e := range x.hist {
		if f.match(e) {
			out = append(out, e)
		}
	}
	return out
}

// Subscribers returns how many subscriptions are live.
func (x *Exchange) Subscribers() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.subs)
}

// Subscription is a live feed of events.
type Subscription struct {
	// C delivers the history that matched when Subscribe was called, then
	// every new matching event, in order, without gaps. It is closed by
	// Cancel, by Close of the Exchange, or when the subscriber fell so far
	// behind that its buffer filled (then Lagged reports true).
	C <-chan evv1.Event
	x *Exchange
	s *sub
}

// Subscribe replays the kept events that match f and then delivers new
// ones. buffer bounds how far the subscriber may fall behind new events.
func (x *Exchange) Subscribe(f Filter, buffer int) *Subscription {
	return x.subscribe(f, buffer, false)
}

// SubscribeNew delivers the matching events published from now on.
func (x *Exchange) SubscribeNew(f Filter, buffer int) *Subscription {
	return x.subscribe(f, buffer, true)
}

func (x *Exchange) subscribe(f Filter, buffer int, fromNow bool) *Subscription {
	x.mu.Lock()
	defer x.mu.Unlock()
	if fromNow {
		f.AfterSeq = x.next - 1
	}
	past := x.historyLocked(f)
	s := &sub{ch: make(chan evv1.Event, len(past)+max(buffer, 1)), filter: f}
	for _, e := range past {
		s.ch <- e
	}
	x.subs[s] = struct{}{}
	return &Subscription{C: s.ch, x: x, s: s}
}

// Cancel ends the subscription.
func (s *Subscription) Cancel() {
	s.x.mu.Lock()
	defer s.x.mu.Unlock()
	if _, ok := s.x.subs[s.s]; ok {
		delete(s.x.subs, s.s)
		close(s.s.ch)
	}
}

// Lagged reports whether the subscription was cut off for falling behind.
func (s *Subscription) Lagged() bool {
	s.x.mu.Lock()
	defer s.x.mu.Unlock()
	return s.s.lagged
}

// Wait returns the next event, false once the subscription has ended or
// ctx is done.
func (s *Subscription) Wait(ctx context.Context) (evv1.Event, bool) {
	select {
	case e, ok := <-s.C:
		return e, ok
	case <-ctx.Done():
		return evv1.Event{}, false
	}
}
