package container

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestPinVolumeSwapped: a directory on a volume's path swapped for a
// symlink between the check and the mount (by a local user who owns it)
// is refused at the mount, and what the symlink points at is never
// mounted; the checked directory itself is pinned, and unpinned without
// its files being touched.
func TestPinVolumeSwapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (bind mounts)")
	}
	base := t.TempDir()
	secret := filepath.Join(base, "secret")
	owned := filepath.Join(base, "owned")
	for _, d := range []string{secret, filepath.Join(owned, "vol")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(owned, "vol", "data"), []byte("results"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "key"), []byte("ca key"), 0o600); err != nil {
		t.Fatal(err)
	}
	vs, err := checkVolumes([]Volume{{Host: filepath.Join(owned, "vol"), Path: "/data"}}, []string{secret})
	if err != nil {
		t.Fatal(err)
	}

	// Pinned as checked: the pin shows the volume.
	dir := t.TempDir()
	pinned, unpin, err := pinVolumes(vs, dir)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(pinned[0].Host, "data")); err != nil || string(b) != "results" {
		t.Fatalf("pin %s shows %q, %v", pinned[0].Host, b, err)
	}
	unpin()
	if _, err := os.Stat(filepath.Join(dir, pinsDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pins left after unpin: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(owned, "vol", "data")); err != nil || string(b) != "results" {
		t.Fatalf("the volume after unpin: %q, %v", b, err)
	}

	// The owner swaps its dir for a symlink to the hidden dir, with a
	// "vol" in it, after the check.
	if err := os.Rename(owned, owned+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(secret, "vol"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, owned); err != nil {
		t.Fatal(err)
	}
	_, unpin, err = pinVolumes(vs, dir)
	defer unpin()
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("a volume swapped for a symlink after its check was pinned: %v", err)
	}
	if err := removeDir(dir); err != nil {
		t.Fatal(err)
	}
}
