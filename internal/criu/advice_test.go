package criu_test

import (
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/criu"
)

// TestLastErrorsAdvice: an error whose cause cairn knows is followed by
// what to do about it; others are left as CRIU printed them.
func TestLastErrorsAdvice(t *testing.T) {
	tests := []struct {
		name, log, want string
		advice          bool
	}{
		{
			name: "inotify watch on an unreachable file",
			log: "(00.074858) Error (criu/fsnotify.c:284): fsnotify: \tCan't dump that handle\n" +
				"(00.074883) Error (criu/cr-dump.c:1545): Dump files (pid: 5164) failed with -1\n",
			want:   "fsnotify: Can't dump that handle (a process watches (inotify) a file",
			advice: true,
		},
		{
			// PostgreSQL, which refuses to run as root, dumped by a root
			// without CAP_SYS_RESOURCE.
			name:   "rlimits of another uid",
			log:    "(00.0301) Error (criu/cr-dump.c:1020): Can't get rlimit 0: Operation not permitted\n",
			want:   "Can't get rlimit 0: Operation not permitted (this node's root lacks CAP_SYS_RESOURCE",
			advice: true,
		},
		{
			name: "unknown error",
			log:  "(00.05) Error (criu/files-reg.c:1790): Can't lookup mount=27 for fd=1 path=/tmp/out\n",
			want: "Can't lookup mount=27 for fd=1 path=/tmp/out",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := criu.LastErrors([]byte(tc.log), 3)
			if !strings.HasPrefix(got, tc.want) {
				t.Errorf("LastErrors = %q, want it to start with %q", got, tc.want)
			}
			if advice := strings.Contains(got, "remove the watch") || strings.Contains(got, "docs/limits.md"); advice != tc.advice {
				t.Errorf("LastErrors = %q: advice %v, want %v", got, advice, tc.advice)
			}
		})
	}
}
