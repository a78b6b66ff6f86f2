package rpc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
)

// EachEvent calls fn with every event of the stream q selects, and the
// line it came as, until the stream ends or ctx is done (then it returns
// nil). The coordinator cuts off a follower that leaves events unread for
// too long (suspended, or writing to a stalled pipe): with q.Follow the
// stream is taken up again after the last event fn got, up to 3 times in
// a row without an event. A line that is no event ends the stream with an
// error.
func (c *CoordClient) EachEvent(ctx context.Context, q EventsQuery, fn func(e evv1.Event, line []byte)) error {
	for fails := 0; ; {
		body, err := c.Events(ctx, q)
		if err != nil {
			return err
		}
		n, last, err := eachEvent(body, fn)
		body.Close()
		if n > 0 {
			q.After, fails = last, 0
		}
		if err == nil || ctx.Err() != nil {
			return nil
		}
		var bad badEventError
		if fails++; !q.Follow || errors.As(err, &bad) || fails > 3 {
			return fmt.Errorf("event stream: %w", err)
		}
	}
}

// badEventError is a line of the event stream that is no event.
type badEventError struct{ err error }

func (e badEventError) Error() string { return e.err.Error() }
func (e badEventError) Unwrap() error { return e.err }

// eachEvent calls fn with the events of an event stream until it ends,
// and returns how many there were and the last one's number.
func eachEvent(body io.Reader, fn func(evv1.Event, []byte)) (n int, last uint64, err error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e evv1.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return n, last, badEventError{err}
		}
		fn(e, sc.Bytes())
		n, last = n+1, e.Seq
	}
	return n, last, sc.Err()
}

// SetSince sets where q starts from s as people write it: an event
// number (events after it), a duration (events of the last one, before
// now) or an RFC 3339 time.
func (q *EventsQuery) SetSince(s string, now time.Time) error {
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		q.After = n
	} else if d, err := time.ParseDuration(s); err == nil {
		q.Since = now.Add(-d)
	} else if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		q.Since = t
	} else {
		return fmt.Errorf("%q: want an event number, a duration or an RFC 3339 time", s)
	}
	return nil
}
