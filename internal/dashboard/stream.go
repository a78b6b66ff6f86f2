package dashboard

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/events"
)

// keepalive is how often an idle event stream sends a comment: it keeps
// proxies from closing it and finds a browser that went away.
const keepalive = 15 * time.Second

// streamBuffer is how far a stream may fall behind new events before its
// subscription is cut off and resumed from the history.
const streamBuffer = 1024

// serveEvents streams the cluster's events as Server-Sent Events: first
// a "ready" event once the stream is live (the page then reads the data
// it shows, so it misses nothing), then each event as a message whose id
// is its number. A browser that reconnects (Last-Event-ID) gets what it
// missed from the history first.
func (d *Dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	var f events.Filter
	resume := false
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "Last-Event-ID: want an event number")
			return
		}
		f.AfterSeq, resume = n, true
	}
	select {
	case d.streams <- struct{}{}:
		defer func() { <-d.streams }()
	default:
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("%d event streams are open already", cap(d.streams)))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	subscribe := func() *events.Subscription {
		if resume {
			return d.cfg.Events.Subscribe(f, streamBuffer)
		}
		return d.cfg.Events.SubscribeNew(f, streamBuffer)
	}
	sub := subscribe()
	defer func() { sub.Cancel() }()
	out := &sse{w: w, rc: http.NewResponseController(w), timeout: d.cfg.WriteTimeout}
	if out.write("retry: 2000\nevent: ready\ndata: {}\n\n") != nil {
		return
	}
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for d.follow(r, out, sub, tick.C, &f) {
		// Fell behind: resume from the last event sent, out of the history.
		sub.Cancel()
		resume = true
		sub = subscribe()
	}
}

// follow sends sub's events until it ends: true if it was cut off for
// falling behind, false if the stream is over. f.AfterSeq follows what
// was sent.
func (d *Dashboard) follow(r *http.Request, out *sse, sub *events.Subscription, tick <-chan time.Time, f *events.Filter) bool {
	for {
		select {
		case <-r.Context().Done():
			return false
		case <-tick:
			if out.write(": keepalive\n\n") != nil {
				return false
			}
		case e, ok := <-sub.C:
			if !ok {
				return sub.Lagged()
			}
			if out.event(e) != nil {
				return false
			}
			f.AfterSeq = e.Seq
		}
	}
}

// sse writes a stream's messages, each write bounded by a deadline.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (s *sse) event(e evv1.Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return s.write(fmt.Sprintf("id: %d\ndata: %s\n\n", e.Seq, b))
}

// write sends msg within the timeout, then lifts the deadline while the
// stream waits: an HTTP/2 stream's deadline ends the stream when it
// passes, written to or not.
func (s *sse) write(msg string) error {
	// Unsupported deadlines (a test's ResponseWriter) only leave the
	// writes unbounded.
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := s.w.Write([]byte(msg)); err != nil {
		return err
	}
	if err := s.rc.Flush(); err != nil {
		return err
	}
	_ = s.rc.SetWriteDeadline(time.Time{})
	return nil
}
