package container_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestVolumes: a host directory bound into a container is written through,
// survives a checkpoint, kill and restore (it is outside the checkpoint:
// what was written after the checkpoint stays), and volumes that would
// show what cairn hides (as written or through a symlink), the host's
// /proc or /sys, or shadow the container's own /proc, /dev and tools, are
// refused.
func TestVolumes(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	vol := t.TempDir()
	cfg := container.Config{Name: "v", Volumes: []container.Volume{{Host: vol, Path: "/data"}}, Memory: 64 << 20,
		Args: []string{"sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /data/count; sleep 0.05; done"}}
	if _, err := m.Run(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		b, _ := os.ReadFile(filepath.Join(vol, "count"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	testutil.WaitUntil(t, 10*time.Second, func() (bool, string) { return count() > 5, "nothing written to the volume" })
	if _, err := m.Checkpoint(ctx, "v", container.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(ctx, "v", 9); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Wait(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	before := count()
	if _, err := m.Restore(ctx, "v", container.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, 10*time.Second, func() (bool, string) {
		return count() != before, "the restored container does not write to its volume"
	})
	toData, toProc, toSys := filepath.Join(t.TempDir(), "data"), filepath.Join(t.TempDir(), "proc"), filepath.Join(t.TempDir(), "sys")
	for link, to := range map[string]string{toData: env.DataDir, toProc: "/proc", toSys: "/sys/fs/cgroup"} {
		if err := os.Symlink(to, link); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []container.Volume{
		{Host: toData, Path: "/x"},
		{Host: toProc, Path: "/x"},
		{Host: toSys, Path: "/x"},
		{Host: "/proc", Path: "/x"},
		{Host: "/sys", Path: "/x"},
		{Host: env.DataDir, Path: "/x"},
		{Host: filepath.Dir(env.DataDir), Path: "/x"},
		{Host: "/", Path: "/x"},
		{Host: "relative", Path: "/x"},
		{Host: vol, Path: "/proc/x"},
		{Host: vol, Path: "/.cairn"},
		{Host: vol, Path: "/"},
		{Host: filepath.Join(vol, "missing"), Path: "/x"},
	} {
		_, err := m.Run(ctx, container.Config{Name: "bad", Volumes: []container.Volume{v}, Args: []string{"true"}})
		if !errors.Is(err, container.ErrBadConfig) {
			t.Errorf("volume %s:%s: %v, want ErrBadConfig", v.Host, v.Path, err)
		}
	}
}

// TestVolumeOnKernelFS: a directory that is the host's /proc mounted
// elsewhere is refused as a volume: what is checked is the file system,
// not the path.
func TestVolumeOnKernelFS(t *testing.T) {
	env := testutil.NewEnv(t)
	dir := t.TempDir()
	if err := syscall.Mount("/proc", dir, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	_, err := env.Manager.Run(context.Background(), container.Config{Name: "bad", Volumes: []container.Volume{{Host: dir, Path: "/x"}}, Args: []string{"true"}})
	if !errors.Is(err, container.ErrBadConfig) || !strings.Contains(err.Error(), "procfs") {
		t.Fatalf("the host's /proc bound at %s as a volume: %v, want ErrBadConfig naming procfs", dir, err)
	}
}

// TestNoSetuidFiles: a container cannot make a file setuid or setgid,
// on a volume (where a host user could run it with root's rights) or
// anywhere: chmod, install -m and a copy keeping a setuid binary's mode
// are refused, and the host sees no such file. The rest of its file
// modes work as before.
func TestNoSetuidFiles(t *testing.T) {
	env := testutil.NewEnv(t)
	vol := t.TempDir()
	if err := os.Chmod(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := env.Manager.Run(ctx, container.Config{Name: "c", Volumes: []container.Volume{{Host: vol, Path: "/v"}}, Args: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	out := execOut(t, env.Manager, "c", `cp /bin/sh /v/sh; chmod 4755 /v/sh 2>/dev/null && echo CHMOD-SETUID
chmod 2755 /v/sh 2>/dev/null && echo CHMOD-SETGID
install -m 4755 /bin/sh /v/sh2 2>/dev/null && echo INSTALL-SETUID
cp -p /usr/bin/passwd /v/passwd 2>/dev/null; chmod 0750 /v/sh && echo PLAIN-OK
python3 -c 'import os; os.close(os.open("/v/py", os.O_CREAT|os.O_WRONLY, 0o4755))' 2>/dev/null; echo DONE`)
	for _, bad := range []string{"CHMOD-SETUID", "CHMOD-SETGID", "INSTALL-SETUID"} {
		if strings.Contains(out, bad) {
			t.Errorf("the container could: %s\n%s", bad, out)
		}
	}
	if !strings.Contains(out, "PLAIN-OK") || !strings.Contains(out, "DONE") {
		t.Fatalf("plain modes failed:\n%s", out)
	}
	ents, err := os.ReadDir(vol)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err == nil && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("the host sees %s with mode %v", e.Name(), fi.Mode())
		}
	}
	// A container with the filter checkpoints and restores.
	if _, err := env.Manager.Checkpoint(ctx, "c", container.CheckpointOptions{Stop: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Manager.Restore(ctx, "c", container.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if out := execOut(t, env.Manager, "c", "chmod 4755 /v/sh 2>/dev/null && echo CHMOD-SETUID; echo DONE"); strings.Contains(out, "CHMOD-SETUID") {
		t.Errorf("after a restore, the container could make a file setuid")
	}
}
