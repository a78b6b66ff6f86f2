package container

import (
	"os"
	"path/filepath"
	"testing"
)

// TestTransientDump: a dump is tried again when CRIU's log says a task
// could not be seized, or a cgroup controller could not be mounted
// because another CRIU held it busy; not for any other failure, nor
// without a log.
func TestTransientDump(t *testing.T) {
	for _, tc := range []struct {
		log, want string
	}{
		{"(00.01) Error (compel/src/lib/infect.c:355): Unseizable non-zombie 42 found, state D, err 0/0\n", "CRIU could not seize a task"},
		{"(00.10) Error (criu/cgroup.c:623): cg: Unable to create the cgroup (net_cls) file system: Device or resource busy\n(00.10) Error (criu/cr-dump.c:1599): Dump core (pid: 31273) failed with -1\n", "CRIU found a cgroup hierarchy busy"},
		{"(00.10) Error (criu/cgroup.c:480): cg: Can't mount controller net_cls: Device or resource busy\n", "CRIU found a cgroup hierarchy busy"},
		{"(00.10) Error (criu/cgroup.c:623): cg: Unable to create the cgroup (net_cls) file system: No such device\n", ""},
		{"(00.10) Error (criu/sk-unix.c:400): unix: Can't dump an external unix socket\n", ""},
		{"(00.10) Error (criu/files-reg.c:1): Device or resource busy\n", ""},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "dump.log"), []byte(tc.log), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := transientDump(dir); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.log, got, tc.want)
		}
	}
	if got := transientDump(t.TempDir()); got != "" {
		t.Errorf("no log: %q, want nothing", got)
	}
}
