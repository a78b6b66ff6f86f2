package rpc

import (
	"testing"
	"time"
)

func TestSetSince(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in    string
		after uint64
		since time.Time
		ok    bool
	}{
		{"120", 120, time.Time{}, true},
		{"10m", 0, now.Add(-10 * time.Minute), true},
		{"2026-11-26T11:00:00Z", 0, now.Add(-time.Hour), true},
		{"yesterday", 0, time.Time{}, false},
	} {
		var q EventsQuery
		err := q.SetSince(tc.in, now)
		if (err == nil) != tc.ok || q.After != tc.after || !q.Since.Equal(tc.since) {
			t.Errorf("SetSince(%q): %+v, %v", tc.in, q, err)
		}
	}
}
