package testbed

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUnmountUnder: every mount below a dir, nested and with a space in
// its path, is detached; a mount beside it is not.
func TestUnmountUnder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("mounting needs root")
	}
	root := t.TempDir()
	dir, beside := filepath.Join(root, "node"), filepath.Join(root, "node-2")
	mounts := []string{filepath.Join(dir, "a"), filepath.Join(dir, "a", "b c"), beside}
	for _, m := range mounts {
		if err := os.MkdirAll(m, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", m, "tmpfs", 0, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(m, unix.MNT_DETACH) })
	}
	if err := unmountUnder(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	info := string(b)
	for _, m := range mounts[:2] {
		if strings.Contains(info, " "+strings.ReplaceAll(m, " ", `\040`)+" ") {
			t.Errorf("%s still mounted", m)
		}
	}
	if !strings.Contains(info, " "+beside+" ") {
		t.Errorf("%s, beside the dir, was unmounted", beside)
	}
}
