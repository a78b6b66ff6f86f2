package coord

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	agentv1 "cairn/api/agent/v1"
	"cairn/internal/events"
)

// serveEvents streams the event history that matches the query as JSON
// lines, then, with follow=1, every new matching event until the caller
// goes away.
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
	enc := json.NewEncoder(w)
	flush := func() {
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
	}
	flush()
	if !follow {
		for _, e := range c.opts.Events.History(f) {
			if enc.Encode(e) != nil {
				return
			}
		}
		return
	}
	for {
		sub := c.opts.Events.Subscribe(f, 4096)
		for {
			e, ok := sub.Wait(r.Context())
			if !ok {
				break
			}
			if enc.Encode(e) != nil {
				sub.Cancel()
				return
			}
			if len(sub.C) == 0 {
				flush()
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
