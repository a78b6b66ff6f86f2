package main

import (
	"testing"
	"time"
)

// TestParseSince: --since takes a duration ago or a time, in RFC 3339 or
// as a local date and time; anything else, or a negative duration, is
// refused.
func TestParseSince(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 30, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"10m":                         now.Add(-10 * time.Minute),
		"1h30m":                       now.Add(-90 * time.Minute),
		"2026-11-29T10:00:00Z":        time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
		"2026-11-29T11:00:00.5+01:00": time.Date(2026, 11, 29, 10, 0, 0, 5e8, time.UTC),
		"2026-11-29 10:00":            time.Date(2026, 11, 29, 10, 0, 0, 0, time.Local),
		"2026-11-29 10:00:07":         time.Date(2026, 11, 29, 10, 0, 7, 0, time.Local),
		"2026-11-29":                  time.Date(2026, 11, 29, 0, 0, 0, 0, time.Local),
	} {
		got, err := parseSince(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("--since %s: %s, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"-5m", "yesterday", "10:00", ""} {
		if _, err := parseSince(in, now); err == nil {
			t.Errorf("--since %q accepted", in)
		}
	}
}
