package proc_test

import (
	"syscall"
	"testing"

	"github.com/cairn-hpc/cairn/internal/proc"
)

func TestParseSignal(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want syscall.Signal
		ok   bool
	}{
		{"KILL", syscall.SIGKILL, true},
		{"SIGTERM", syscall.SIGTERM, true},
		{"9", syscall.SIGKILL, true},
		{"64", 64, true},
		{"0", 0, false},
		{"65", 0, false},
		{"SIG", 0, false},
		{"kill", 0, false},
	} {
		got, err := proc.ParseSignal(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseSignal(%q) = %v, %v; want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
