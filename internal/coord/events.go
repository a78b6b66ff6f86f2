package coord

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/events"
)

// serveEvents streams the event history that matches the query as JSON
// lines, then, with follow=1, every new matching event until the caller
// goes away. A caller that leaves what it is sent unread for
// Options.WriteTimeout is cut off: its subscription ends, and with it
// everything kept for it.
func (c *Coordinator) serveEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := events.Filter{Job: q.Get("job"), Type: q.Get("type")}
	if s := q.Get("after"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "after: want an event number")
			return
		}
		f.AfterSeq = n
	}
	if s := q.Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "since: want an RFC 3339 time")
			return
		}
		f.Since = t
	}
	follow := q.Get("follow") == "1"
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out := &eventWriter{w: w, rc: http.NewResponseController(w), timeout: c.opts.WriteTimeout}
	out.enc = json.NewEncoder(out.w)
	if out.flush() != nil {
		return
	}
	if !follow {
		past := c.opts.Events.History(f)
		for i, e := range past {
			if out.send(e, i == len(past)-1) != nil {
				return
			}
		}
		return
	}
	for {
		sub := c.opts.Events.Subscribe(f, followBuffer)
		for {
			e, ok := sub.Wait(r.Context())
			if !ok {
				break
			}
			if out.send(e, len(sub.C) == 0) != nil {
				sub.Cancel()
				return
			}
			f.AfterSeq = e.Seq
		}
		lagged := sub.Lagged()
		sub.Cancel()
		if !lagged || r.Context().Err() != nil {
			return
		}
		// Fell behind: resume from the last event sent, out of the history.
	}
}

// followBuffer is how many events a follower may fall behind before its
// subscription is cut off and resumed from the history.
const followBuffer = 4096

// eventWriter writes events to a caller, each write bounded by a deadline.
type eventWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	enc     *json.Encoder
	timeout time.Duration
}

// send writes e, and flushes it if last (no other event is waiting). It
// fails if the caller takes nothing for the timeout.
func (o *eventWriter) send(e evv1.Event, last bool) error {
	// Unsupported deadlines (an http.ResponseWriter of a test) only
	// leave the writes unbounded.
	_ = o.rc.SetWriteDeadline(time.Now().Add(o.timeout))
	if err := o.enc.Encode(e); err != nil {
		return err
	}
	if !last {
		return nil
	}
	return o.flush()
}

// flush sends what is buffered within the timeout, then lifts the deadline
// while the stream waits for events: an HTTP/2 stream's deadline ends the
// stream when it passes, written to or not.
func (o *eventWriter) flush() error {
	_ = o.rc.SetWriteDeadline(time.Now().Add(o.timeout))
	if err := o.rc.Flush(); err != nil {
		return err
	}
	_ = o.rc.SetWriteDeadline(time.Time{})
	return nil
}
