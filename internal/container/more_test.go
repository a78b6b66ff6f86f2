package container_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestSuccessiveCheckpoints takes three checkpoints, restores a copy from
// the oldest beside the running original, then restores the original from
// the middle one.
func TestSuccessiveCheckpoints(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in := runStateApp(t, env, "app")
	waitStreaming(t, in.Log, 0, 1000)
	var counts []int
	for i := 1; i <= 3; i++ {
		man, err := m.Checkpoint(ctx, "app", container.CheckpointOptions{})
		if err != nil {
			t.Fatalf("checkpoint %d: %v", i, err)
		}
		if man.Seq != i {
			t.Fatalf("checkpoint %d got seq %d", i, man.Seq)
		}
		counts = append(counts, len(ckptCount(t, env, "app", i)))
		time.Sleep(150 * time.Millisecond)
	}
	if !(counts[0] < counts[1] && counts[1] < counts[2]) {
		t.Fatalf("checkpoint counters not increasing: %v", counts)
	}
	list, err := m.Checkpoints("app")
	if err != nil || len(list) != 3 {
		t.Fatalf("Checkpoints: %d, %v", len(list), err)
	}

	// A copy from checkpoint 1 beside the running original.
	clone, err := m.Restore(ctx, "app", container.RestoreOptions{Seq: 1, As: "clone"})
	if err != nil {
		t.Fatal(err)
	}
	if clone.Addr == in.Addr {
		t.Fatalf("clone took the original's address %s", in.Addr)
	}
	waitStreaming(t, clone.Log, 0, 1000)
	time.Sleep(100 * time.Millisecond)
	cl := readCount(t, clone)
	at1 := ckptCount(t, env, "app", 1)
	if len(cl) <= len(at1) || strings.Join(cl[:len(at1)], "\n") != strings.Join(at1, "\n") {
		t.Fatalf("clone's count.log does not continue checkpoint 1 (%d lines, checkpoint %d)", len(cl), len(at1))
	}
	checkContiguous(t, cl)
	if orig, _ := m.Get(ctx, "app"); orig.Status != container.StatusRunning || orig.Pid != in.Pid {
		t.Fatalf("original disturbed by the clone: %+v", orig)
	}

	// Restoring the running original is refused; after a kill, restoring
	// from checkpoint 2 works.
	if _, err := m.Restore(ctx, "app", container.RestoreOptions{Seq: 2}); !errors.Is(err, container.ErrRunning) {
		t.Fatalf("restore of a running container: %v, want ErrRunning", err)
	}
	if err := m.Kill(ctx, "app", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	logBefore, _ := os.ReadFile(in.Log)
	in, err = m.Restore(ctx, "app", container.RestoreOptions{Seq: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitStreaming(t, in.Log, len(logBefore), 500)
	time.Sleep(100 * time.Millisecond)
	now := readCount(t, in)
	at2 := ckptCount(t, env, "app", 2)
	if len(now) <= len(at2) || strings.Join(now[:len(at2)], "\n") != strings.Join(at2, "\n") {
		t.Fatalf("count.log does not continue checkpoint 2")
	}
	checkContiguous(t, now)
}

// TestCheckpointStop stops the container with the dump; it shows as
// checkpointed and restores.
func TestCheckpointStop(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	in := runStateApp(t, env, "app", "-no-stream")
	waitLog(t, in.Log, 0, "count=50", func(b []byte) bool { return bytes.Contains(b, []byte("count=50")) })
	if _, err := env.Manager.Checkpoint(ctx, "app", container.CheckpointOptions{Stop: true}); err != nil {
		t.Fatal(err)
	}
	in, err := env.Manager.Wait(ctx, "app")
	if err != nil || in.Status != container.StatusCheckpointed {
		t.Fatalf("after checkpoint --stop: %v %+v", err, in)
	}
	at := ckptCount(t, env, "app", 1)
	in, err = env.Manager.Restore(ctx, "app", container.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("count=%d ", len(at)+20)
	waitLog(t, filepath.Join(in.RootFS, countFile), 0, want, func(b []byte) bool { return bytes.Contains(b, []byte(want)) })
	checkContiguous(t, readCount(t, in))
}

func TestMissingContainer(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	if _, err := env.Manager.Checkpoint(ctx, "nope", container.CheckpointOptions{}); !errors.Is(err, container.ErrNotFound) {
		t.Errorf("checkpoint of a missing container: %v, want ErrNotFound", err)
	}
	if _, err := env.Manager.Restore(ctx, "nope", container.RestoreOptions{}); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("restore without checkpoints: %v, want image.ErrNotFound", err)
	}
	if err := env.Manager.Remove(ctx, "nope", true); !errors.Is(err, container.ErrNotFound) {
		t.Errorf("rm of a missing container: %v", err)
	}
	if _, err := env.Manager.Run(ctx, container.Config{Name: "../x", Args: []string{"true"}}); err == nil {
		t.Error("run accepted the name ../x")
	}
}

// TestRestoreRefusesBadImages damages the store in each way a disk or a
// person can, and checks that restore refuses (or repairs) it before CRIU
// runs, says what is wrong and which checkpoints it affects, and leaves the
// stopped container and the other checkpoints as they were.
func TestRestoreRefusesBadImages(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in := runStateApp(t, env, "app", "-no-stream", "-mem", "4")
	waitLog(t, in.Log, 0, "memory", func(b []byte) bool { return bytes.Contains(b, []byte("ready")) })
	if _, err := m.Checkpoint(ctx, "app", container.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	other := runStateApp(t, env, "other", "-no-stream")
	waitLog(t, other.Log, 0, "count", func(b []byte) bool { return bytes.Contains(b, []byte("count=")) })
	if _, err := m.Checkpoint(ctx, "other", container.CheckpointOptions{Stop: true}); err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(ctx, "app", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(in.RootFS, "root/marker")
	if err := os.WriteFile(marker, []byte("still here"), 0o644); err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(env.DataDir, "store")
	rec, err := m.Repo().Load("app", 1)
	if err != nil {
		t.Fatal(err)
	}
	backup := t.TempDir()
	if err := os.CopyFS(backup, os.DirFS(storeDir)); err != nil {
		t.Fatal(err)
	}
	restoreBackup := func() {
		os.RemoveAll(storeDir)
		if err := os.CopyFS(storeDir, os.DirFS(backup)); err != nil {
			t.Fatal(err)
		}
	}
	biggestPack := func() string {
		var best string
		var size int64
		filepath.Walk(filepath.Join(storeDir, "packs"), func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() && fi.Size() > size {
				best, size = p, fi.Size()
			}
			return nil
		})
		return best
	}
	manifestFile := func() string {
		var found string
		filepath.Walk(filepath.Join(storeDir, "manifests"), func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() && strings.Contains(p, rec.Manifest.String()) {
				found = p
			}
			return nil
		})
		return found
	}
	recordFile := filepath.Join(env.DataDir, "checkpoints", "app", "1.json")
	goodRecord, err := os.ReadFile(recordFile)
	if err != nil {
		t.Fatal(err)
	}
	restoreStore := restoreBackup
	restoreBackup = func() {
		restoreStore()
		if err := os.WriteFile(recordFile, goodRecord, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name   string
		damage func() error
		want   string // in the error; "" means restore repairs and succeeds
	}{
		{"flipped byte in pack", func() error { return flipByte(biggestPack(), 5000) }, "chunk"},
		{"truncated pack", func() error { return os.Truncate(biggestPack(), 10000) }, "chunk"},
		{"deleted pack", func() error { return os.Remove(biggestPack()) }, "chunk"},
		{"corrupted manifest", func() error { return flipByte(manifestFile(), 40) }, "manifest"},
		{"deleted manifest", func() error { return os.Remove(manifestFile()) }, "manifest"},
		{"corrupted record", func() error { return os.WriteFile(recordFile, []byte("{not json"), 0o600) }, "record"},
		{"deleted index", func() error { return os.RemoveAll(filepath.Join(storeDir, "index")) }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defer restoreBackup()
			if err := tc.damage(); err != nil {
				t.Fatal(err)
			}
			_, err := m.Restore(ctx, "app", container.RestoreOptions{Seq: 1})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("restore after %s: %v", tc.name, err)
				}
				if err := m.Kill(ctx, "app", syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, image.ErrCorrupt) {
				t.Fatalf("restore of damaged image: %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "app:1") {
				t.Errorf("error %q should name %q and the checkpoint", err, tc.want)
			}
			if _, verr := m.Repo().Verify(ctx, "app", 1, true, nil); !errors.Is(verr, image.ErrCorrupt) {
				t.Errorf("verify of damaged image: %v", verr)
			}
			// Nothing changed: CRIU never ran, the old container and its
			// files are as they were.
			if _, err := os.Stat(filepath.Join(in.Dir, "restore.log")); err == nil {
				t.Error("CRIU ran on a damaged image")
			}
			if got, _ := m.Get(ctx, "app"); got.Status != container.StatusExited {
				t.Errorf("container status %s after refused restore", got.Status)
			}
			if b, err := os.ReadFile(marker); err != nil || string(b) != "still here" {
				t.Errorf("container files changed by a refused restore: %q %v", b, err)
			}
		})
	}
	// A flipped byte in a chunk both checkpoints share names both.
	{
		defer restoreBackup()
		st, err := m.Repo().OpenReader()
		if err != nil {
			t.Fatal(err)
		}
		mOther, _ := m.Repo().Load("other", 1)
		man1, err1 := st.LoadManifest(ctx, rec.Manifest)
		man2, err2 := st.LoadManifest(ctx, mOther.Manifest)
		st.Close()
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		shared := map[store.ID]bool{}
		for _, id := range man1.ChunkIDs() {
			shared[id] = true
		}
		n := 0
		for _, id := range man2.ChunkIDs() {
			if shared[id] {
				n++
			}
		}
		if n == 0 {
			t.Fatal("the two images share no chunk")
		}
	}
	// The undamaged store restores both.
	if _, err := m.Restore(ctx, "app", container.RestoreOptions{Seq: 1}); err != nil {
		t.Fatalf("restore after repair of the store: %v", err)
	}
	if _, err := m.Restore(ctx, "other", container.RestoreOptions{}); err != nil {
		t.Fatalf("restore of the other checkpoint: %v", err)
	}
}

func flipByte(p string, off int64) error {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if off >= fi.Size() {
		off = fi.Size() / 2
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		return err
	}
	b[0] ^= 0x40
	_, err = f.WriteAt(b, off)
	return err
}

// TestRestoreRefusesUnsafeDelta swaps a checkpoint's manifest for one whose
// fs delta holds a device node: restore must refuse it before anything
// changes and write nothing outside the container.
func TestRestoreRefusesUnsafeDelta(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in := runStateApp(t, env, "app", "-no-stream")
	waitLog(t, in.Log, 0, "count", func(b []byte) bool { return bytes.Contains(b, []byte("count=")) })
	if _, err := m.Checkpoint(ctx, "app", container.CheckpointOptions{Stop: true}); err != nil {
		t.Fatal(err)
	}
	rec, err := m.Repo().Load("app", 1)
	if err != nil {
		t.Fatal(err)
	}
	recordFile := filepath.Join(env.DataDir, "checkpoints", "app", "1.json")
	good, _ := os.ReadFile(recordFile)
	for _, bad := range []store.Node{
		{Path: "fs/dev-null", Kind: store.KindCharDev, Major: 1, Minor: 3, Mode: 0o666},
		{Path: "fs/disk", Kind: store.KindBlockDev, Major: 8, Mode: 0o660},
	} {
		t.Run(bad.Path, func(t *testing.T) {
			st, err := m.Repo().OpenWriter(ctx)
			if err != nil {
				t.Fatal(err)
			}
			man, err := st.LoadManifest(ctx, rec.Manifest)
			if err != nil {
				t.Fatal(err)
			}
			man.Nodes = append(man.Nodes, bad)
			id, err := st.PutManifest(ctx, man)
			st.Close()
			if err != nil {
				t.Fatal(err)
			}
			swapped := bytes.Replace(good, []byte(rec.Manifest.String()), []byte(id.String()), 1)
			if err := os.WriteFile(recordFile, swapped, 0o600); err != nil {
				t.Fatal(err)
			}
			defer os.WriteFile(recordFile, good, 0o600)
			_, err = m.Restore(ctx, "app", container.RestoreOptions{})
			if !errors.Is(err, image.ErrUnsafeEntry) {
				t.Fatalf("restore with a %v node: %v, want ErrUnsafeEntry", bad.Kind, err)
			}
			if got, _ := m.Get(ctx, "app"); got.Status != container.StatusCheckpointed {
				t.Errorf("container status %s after refused restore", got.Status)
			}
		})
	}
	if _, err := m.Restore(ctx, "app", container.RestoreOptions{}); err != nil {
		t.Fatalf("restore with the good manifest: %v", err)
	}
}

// TestCheckpointRefusesDeviceInDelta: a device node in the upper dir makes
// the checkpoint fail cleanly; the container keeps running.
func TestCheckpointRefusesDeviceInDelta(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	in := runStateApp(t, env, "app", "-no-stream")
	if err := syscall.Mknod(filepath.Join(in.Dir, "upper", "null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatal(err)
	}
	_, err := env.Manager.Checkpoint(ctx, "app", container.CheckpointOptions{})
	if !errors.Is(err, image.ErrUnsafeEntry) {
		t.Fatalf("checkpoint with a device in the delta: %v", err)
	}
	expectRunningNoCheckpoint(t, env, "app")
}

// TestDumpFailureResumes makes CRIU fail in the middle of a dump, after it
// froze the container and injected its parasite: the staging area is a
// 4 MiB tmpfs and the program holds 16 MiB, so writing the memory pages
// fails with ENOSPC. The container must be resumed and keep running, and
// no checkpoint may be listed.
func TestDumpFailureResumes(t *testing.T) {
	staging := t.TempDir()
	if err := syscall.Mount("tmpfs", staging, "tmpfs", 0, "size=4m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(staging, syscall.MNT_DETACH) })
	env := testutil.NewEnv(t, func(o *container.Options) { o.StagingDir = staging })
	env.StagingDir = staging
	ctx := context.Background()
	in := runStateApp(t, env, "app", "-mem", "16")
	waitLog(t, in.Log, 0, "memory", func(b []byte) bool { return bytes.Contains(b, []byte("mem=16MiB ready")) })
	waitStreaming(t, in.Log, 0, 500)
	_, err := env.Manager.Checkpoint(ctx, "app", container.CheckpointOptions{})
	if !errors.Is(err, container.ErrDumpFailed) || !strings.Contains(err.Error(), "CRIU:") {
		t.Fatalf("checkpoint into a full staging area: %v, want ErrDumpFailed with CRIU's reason", err)
	}
	t.Logf("error as users see it: %v", err)
	expectRunningNoCheckpoint(t, env, "app")
	b, _ := os.ReadFile(in.Log)
	waitStreaming(t, in.Log, len(b), lastRecv(b)+1000)
}

func expectRunningNoCheckpoint(t *testing.T, env *testutil.Env, name string) {
	t.Helper()
	got, err := env.Manager.Get(context.Background(), name)
	if err != nil || got.Status != container.StatusRunning {
		t.Fatalf("container after failed checkpoint: %v %+v", err, got)
	}
	ms, _ := env.Manager.Checkpoints(name)
	if len(ms) != 0 {
		t.Fatalf("failed checkpoint listed: %+v", ms[0])
	}
	ents, _ := os.ReadDir(filepath.Join(env.DataDir, "checkpoints", name))
	if len(ents) != 0 {
		t.Fatalf("failed checkpoint left %s", ents[0].Name())
	}
	ents, _ = os.ReadDir(env.StagingDir)
	if len(ents) != 0 {
		t.Fatalf("failed checkpoint left staging %s", ents[0].Name())
	}
}

// TestCleanupAfterAbruptEnd ends a test halfway, with containers running,
// and checks that its cleanup still removed everything.
func TestCleanupAfterAbruptEnd(t *testing.T) {
	var dataDir, inst string
	t.Run("abrupt", func(t *testing.T) {
		env := testutil.NewEnv(t)
		dataDir, inst = env.DataDir, env.Manager.Instance()
		runStateApp(t, env, "a")
		runStateApp(t, env, "b", "-no-stream")
		if _, err := env.Manager.Checkpoint(context.Background(), "a", container.CheckpointOptions{}); err != nil {
			t.Fatal(err)
		}
		t.SkipNow() // leaves the test the way a failure does
	})
	testutil.CheckNoLeaks(t, dataDir, inst)
}

// TestCheckpointWhileProcessesExit checkpoints a container whose shells
// start short processes all the time. Debian's sh starts them with vfork:
// a cgroup frozen between the vfork and the child's exec cannot be dumped
// (CRIU seizes the child, and the parent then never stops), and CRIU gives
// up after 10 s. Every checkpoint must succeed, and quickly.
func TestCheckpointWhileProcessesExit(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	loop := "while :; do /bin/true; done"
	if _, err := env.Manager.Run(ctx, container.Config{Name: "churn", Args: []string{"sh", "-c", loop + " & " + loop + " & " + loop}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	for i := 1; i <= 15; i++ {
		rec, err := env.Manager.Checkpoint(ctx, "churn", container.CheckpointOptions{})
		if err != nil {
			t.Fatalf("checkpoint %d: %v", i, err)
		}
		// The container frozen far below CRIU's 10 s: no dump attempt
		// waited for a vfork parent. (Not the whole checkpoint: the first
		// one also runs `criu check`, slow on a loaded machine.)
		if d := rec.Timing.Stall; d > 5*time.Second {
			t.Fatalf("checkpoint %d froze the container for %v", i, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
