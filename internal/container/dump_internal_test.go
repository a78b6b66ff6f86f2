package container

import (
	"errors"
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

// TestYardVanished: a start is tried again only when runc met another
// CRIU's cgroup yard gone (as seen in make test, with a net_cls
// hierarchy the host had not mounted), not for any other failure.
func TestYardVanished(t *testing.T) {
	for _, tc := range []struct {
		err  string
		want bool
	}{
		{`runc run failed: unable to start container process: error during container init: error mounting "cgroup" to rootfs at "/sys/fs/cgroup": mount /dev/shm/x/n5/restore-soak.3-37/work/.criu.cgyard.tjWEnc/net_cls:/sys/fs/cgroup/net_cls (via /proc/self/fd/6), flags: 0x20500f: no such file or directory`, true},
		{`runc run failed: unable to start container process: exec: "ringapp": executable file not found in $PATH: no such file or directory`, false},
		{`runc run failed: error mounting "cgroup" to rootfs at "/sys/fs/cgroup": mount /work/.criu.cgyard.x/cpu: permission denied`, false},
	} {
		if got := yardVanished(errors.New(tc.err)); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.err, got, tc.want)
		}
	}
}
