package container_test

import (
	"testing"

	"github.com/cairn-hpc/cairn/internal/container"
)

// TestStatus pins each status's value (what `cairn ps --json` and the agent
// API print) and which statuses count as live and active.
func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		s            container.Status
		value        string
		live, active bool
	}{
		{container.StatusCreated, "created", true, true},
		{container.StatusRunning, "running", true, true},
		{container.StatusPaused, "paused", true, true},
		{container.StatusExiting, "exiting", false, true},
		{container.StatusExited, "exited", false, false},
		{container.StatusStopped, "stopped", false, false},
		{container.StatusCheckpointed, "checkpointed", false, false},
	} {
		t.Run(tc.value, func(t *testing.T) {
			if string(tc.s) != tc.value {
				t.Errorf("value %q, want %q", tc.s, tc.value)
			}
			if tc.s.Live() != tc.live || tc.s.Active() != tc.active {
				t.Errorf("Live %v Active %v, want %v %v", tc.s.Live(), tc.s.Active(), tc.live, tc.active)
			}
		})
	}
}
