package container

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMaskUpper builds a small lower layer and checks what maskUpper puts
// in the upper dir: opaque dirs, whiteouts, parents like the lower's, and
// nothing for paths under a hidden dir or missing from the lower.
func TestMaskUpper(t *testing.T) {
	lower, upper := t.TempDir(), t.TempDir()
	for _, d := range []string{"var/lib/dpkg", "var/lib/etcd", "var/tmp/data/containers", "etc", "run/netns"} {
		if err := os.MkdirAll(filepath.Join(lower, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Chmod(filepath.Join(lower, "var/tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "etc/shadow"), []byte("root:x\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	paths, err := hiddenPaths(lower, []string{"/var/tmp/data", "/var/tmp/data/containers", "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/etc/shadow", "/nonexistent", "/run", "/var/lib/etcd", "/var/tmp/data"}
	if !slices.Equal(paths, want) {
		t.Fatalf("hiddenPaths = %q, want %q", paths, want)
	}
	if err := maskUpper(upper, lower, paths); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"run", "var/lib/etcd", "var/tmp/data"} {
		buf := make([]byte, 8)
		n, err := unix.Lgetxattr(filepath.Join(upper, d), "trusted.overlay.opaque", buf)
		if err != nil || string(buf[:n]) != "y" {
			t.Errorf("%s: opaque xattr %q, %v", d, buf[:n], err)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(upper, "etc/shadow"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("etc/shadow is not a whiteout: %+v, %v", st, err)
	}
	if err := unix.Lstat(filepath.Join(upper, "var/tmp"), &st); err != nil || st.Mode&0o7777 != 0o1777 {
		t.Errorf("var/tmp in upper has mode %o, want 1777 (%v)", st.Mode&0o7777, err)
	}
	for _, p := range []string{"nonexistent", "var/lib/dpkg", "var/tmp/data/containers"} {
		if _, err := os.Lstat(filepath.Join(upper, p)); err == nil {
			t.Errorf("%s is in the upper dir", p)
		}
	}
	// A second pass changes nothing and does not fail.
	if err := maskUpper(upper, lower, paths); err != nil {
		t.Fatal(err)
	}
}
