package testutil

import (
	"errors"
	"strings"
	"testing"
)

// TestRestoredOutput: a ring rank's log is accepted as a restored one's
// only if the output kept with the checkpoint shows the ring's start,
// nothing after it starts again, and the count goes on.
func TestRestoredOutput(t *testing.T) {
	start := "rank 1/3: listening on 10.0.0.2:7171\nrank 1/3: ring connected (upstream a, downstream b)\n"
	kept := start + "rank 1: 40000/100000 msgs\nrank 1: 80000/100000 msgs\n"
	for _, tc := range []struct {
		name     string
		log      string
		restored int
		err      string // "" ok; "progress" errNoProgress
	}{
		{"restored", kept + "rank 1: 96000/100000 msgs\nrank 1: done 100000 msgs\n", len(kept), ""},
		{"restored, done at once", kept + "rank 1: done 100000 msgs\n", len(kept), ""},
		{"restored, checkpoint before any count", start + "rank 1: 16/100000 msgs\n", len(start), ""},
		{"no count since", kept + "some other line\n", len(kept), "progress"},
		{"started afresh", start + "rank 1: 40000/100000 msgs\n", 0, "bytes of its checkpoint's output"},
		{"started afresh after the kept output", kept + start + "rank 1: 90000/100000 msgs\n", len(kept), "started afresh"},
		{"count started again", kept + "rank 1: 16/100000 msgs\n", len(kept), "below the checkpoint's 80000"},
		{"kept output without the start", "rank 1: 80000/100000 msgs\nrank 1: 96000/100000 msgs\n", len("rank 1: 80000/100000 msgs\n"), "never shows the processes starting"},
		{"more kept than the log", kept, len(kept) + 1, "bytes of its checkpoint's output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := restoredOutput(tc.log, int64(tc.restored), RingOutput)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case tc.err == "progress" && !errors.Is(err, errNoProgress):
				t.Fatalf("error %v, want %v", err, errNoProgress)
			case tc.err != "" && tc.err != "progress" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want one saying %q", err, tc.err)
			}
		})
	}
}
