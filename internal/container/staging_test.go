package container_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestStagingDirOfAnotherUser: a staging dir a local user made first
// (tmpfs is empty at every boot, and /dev/shm open to all), one open to
// other users, or one below a dir other users may change, is refused
// with a clear error before CRIU writes any memory into it: the
// checkpoint fails, lists nothing, and the container runs on.
func TestStagingDirOfAnotherUser(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	if _, err := m.Run(ctx, container.Config{Name: "app", Args: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(t.TempDir(), "open")
	for _, c := range []struct {
		what  string
		setup func(dir string) error
	}{
		{"owned by nobody", func(dir string) error {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			return os.Chown(dir, 65534, 65534)
		}},
		{"open to others", func(dir string) error {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			return os.Chmod(dir, 0o777)
		}},
		{"a symlink to a dir of root's", func(dir string) error { return os.Symlink(t.TempDir(), dir) }},
	} {
		t.Run(c.what, func(t *testing.T) {
			os.RemoveAll(env.StagingDir)
			if err := c.setup(env.StagingDir); err != nil {
				t.Fatal(err)
			}
			_, err := m.Checkpoint(ctx, "app", container.CheckpointOptions{})
			if !errors.Is(err, container.ErrUnsafeDir) {
				t.Fatalf("checkpoint into a staging dir %s: %v, want ErrUnsafeDir", c.what, err)
			}
			t.Logf("refused: %v", err)
			if list, _ := m.Checkpoints("app"); len(list) != 0 {
				t.Fatalf("%d checkpoints listed after the refusal", len(list))
			}
			if in, err := m.Get(ctx, "app"); err != nil || in.Status != container.StatusRunning {
				t.Fatalf("the container after the refusal: %v %v", in.Status, err)
			}
		})
	}
	t.Run("below a dir others may change", func(t *testing.T) {
		if err := os.Mkdir(open, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(open, 0o777); err != nil {
			t.Fatal(err)
		}
		other, err := container.New(container.Options{DataDir: env.DataDir, StagingDir: filepath.Join(open, "staging"), Bridge: env.Bridge,
			ShimCommand: []string{os.Args[0], "shim"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Checkpoint(ctx, "app", container.CheckpointOptions{}); !errors.Is(err, container.ErrUnsafeDir) {
			t.Fatalf("checkpoint into a staging dir below a world-writable dir: %v, want ErrUnsafeDir", err)
		}
	})
	// Made by cairn itself, root-only: the checkpoint goes through.
	os.RemoveAll(env.StagingDir)
	if _, err := m.Checkpoint(ctx, "app", container.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(env.StagingDir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("staging dir made by cairn: %v %v, want mode 0700", fi.Mode(), err)
	}
}
