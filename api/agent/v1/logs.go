package v1

import (
	"errors"
	"net/url"
	"strconv"
	"time"
)

// LogQuery is what a GET of PathLogs asks, as its query: which output
// of the container, and how.
type LogQuery struct {
	Incarnation int       // ?incarnation=N: an earlier incarnation's (0: the current one)
	Follow      bool      // ?follow=1: the current one's as it comes, until it exits
	Timestamps  bool      // ?timestamps=1: each line after its time (RFC 3339, UTC; "-" unknown)
	Since       time.Time // ?since=RFC3339: the lines that came from then on only
}

// Values is q as a URL query.
func (q LogQuery) Values() url.Values {
	v := url.Values{}
	if q.Incarnation > 0 {
		v.Set("incarnation", strconv.Itoa(q.Incarnation))
	}
	if q.Follow {
		v.Set("follow", "1")
	}
	if q.Timestamps {
		v.Set("timestamps", "1")
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	return v
}

// ParseLogQuery reads a LogQuery from a URL query.
func ParseLogQuery(v url.Values) (LogQuery, error) {
	q := LogQuery{Follow: v.Get("follow") == "1", Timestamps: v.Get("timestamps") == "1"}
	if s := v.Get("incarnation"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return q, errors.New("incarnation must be a number from 1")
		}
		q.Incarnation = n
	}
	if s := v.Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return q, errors.New("since must be a time as RFC 3339 gives it")
		}
		q.Since = t
	}
	return q, nil
}
