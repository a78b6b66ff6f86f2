package v1_test

import (
	"encoding/json"
	"testing"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// TestStatus pins each status's wire value and which statuses count as
// live and active.
func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		s            agentv1.Status
		value        string
		live, active bool
	}{
		{agentv1.StatusCreated, "created", true, true},
		{agentv1.StatusRunning, "running", true, true},
		{agentv1.StatusPaused, "paused", true, true},
		{agentv1.StatusExiting, "exiting", false, true},
		{agentv1.StatusExited, "exited", false, false},
		{agentv1.StatusStopped, "stopped", false, false},
		{agentv1.StatusCheckpointed, "checkpointed", false, false},
	} {
		t.Run(tc.value, func(t *testing.T) {
			b, err := json.Marshal(agentv1.Container{Status: tc.s})
			if err != nil {
				t.Fatal(err)
			}
			var wire struct{ Status string }
			if err := json.Unmarshal(b, &wire); err != nil || wire.Status != tc.value {
				t.Errorf("wire status %q (%v), want %q", wire.Status, err, tc.value)
			}
			if tc.s.Live() != tc.live || tc.s.Active() != tc.active {
				t.Errorf("Live %v Active %v, want %v %v", tc.s.Live(), tc.s.Active(), tc.live, tc.active)
			}
		})
	}
}
