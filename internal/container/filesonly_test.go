package container_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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

// counterApp keeps a counter in /tmp/app/count and writes /tmp/app/fN for
// every SIGUSR1 (/tmp: a container's root in a user namespace of its own
// may write there); it starts from what /tmp/app holds, and says so with
// what its environment tells it of a restart and the rank API.
const counterApp = `mkdir -p /tmp/app
n=$(cat /tmp/app/count 2>/dev/null || echo 0)
echo "start restart=${CAIRN_RESTART:-none} socket=${CAIRN_SOCKET:-none} count=$n files=$(ls /tmp/app | tr '\n' ' ')"
bump() { n=$((n+1)); echo $n > /tmp/app/f$n; echo $n > /tmp/app/count.tmp; mv /tmp/app/count.tmp /tmp/app/count; echo "count=$n"; }
trap bump USR1
while :; do sleep 0.05; done`

// failingCRIU writes a CRIU stand-in that records every call in the
// returned marker file and fails.
func failingCRIU(t *testing.T) (bin, marker string) {
	t.Helper()
	dir := t.TempDir()
	bin, marker = filepath.Join(dir, "criu"), filepath.Join(dir, "called")
	script := fmt.Sprintf("#!/bin/sh\necho \"$0 $*\" >> %s\necho 'CRIU must not run here' >&2\nexit 1\n", marker)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, marker
}

// noCRIU fails t if the CRIU stand-in was run.
func noCRIU(t *testing.T, marker, what string) {
	t.Helper()
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("%s ran CRIU:\n%s", what, b)
	}
}

// noChunks has no chunk to give.
type noChunks struct{}

func (noChunks) GetSeq(context.Context, []store.ID, func([]byte) error) error {
	return errors.New("no chunks here")
}

// bump makes the counter app count one more and waits for it to say so.
func bump(t *testing.T, m *container.Manager, in *container.Info, want int) {
	t.Helper()
	if err := m.Kill(context.Background(), in.Name, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitLog(t, in.Log, 0, fmt.Sprintf("count=%d", want), func(b []byte) bool {
		return bytes.Contains(b, []byte(fmt.Sprintf("count=%d\n", want)))
	})
}

// TestFilesOnlyRestart: a files-only checkpoint captures the container's
// files while it is frozen, and a restore starts its command afresh on
// exactly those files (later writes rolled back), with CAIRN_RESTART
// naming the checkpoint: in place, paused until Resume (status created,
// the command not started; from the image kept in staging), as a copy
// (from the store), and from a staged image streamed as a migration
// does. The Manager's CRIU is a stand-in that fails and
// records every call: none of this runs it, while a transparent
// checkpoint does.
func TestFilesOnlyRestart(t *testing.T) {
	criuBin, marker := failingCRIU(t)
	env := testutil.NewEnv(t, func(o *container.Options) { o.CRIU, o.KeepImages = criuBin, 64<<20 })
	ctx := context.Background()
	m := env.Manager
	in, err := m.Run(ctx, container.Config{Name: "app", Args: []string{"sh", "-c", counterApp}, RankAPI: true})
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, in.Log, 0, "the start", func(b []byte) bool {
		return bytes.Contains(b, []byte("start restart=none socket=/run/cairn/rank.sock count=0 files=\n"))
	})
	bump(t, m, in, 1)
	bump(t, m, in, 2)

	p, err := m.Prepare(ctx, "app", 0, container.PrepareOptions{FilesOnly: true})
	if err != nil {
		t.Fatalf("files-only prepare: %v", err)
	}
	if got, err := m.Get(ctx, "app"); err != nil || got.Status != container.StatusPaused {
		t.Fatalf("prepared container: %v, %v; want paused", got.Status, err)
	}
	// Asked to count while frozen, it counts only once thawed: not in
	// the checkpoint.
	if err := m.Kill(ctx, "app", syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(p.ImageDir(), image.CRIUDir)); len(ents) != 0 {
		t.Errorf("a files-only prepare staged CRIU files: %v", ents)
	}
	rec, err := p.Commit(ctx, nil)
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	waitLog(t, in.Log, 0, "count=3", func(b []byte) bool { return bytes.Contains(b, []byte("count=3\n")) })
	stored, err := m.Repo().Load("app", rec.Seq)
	if err != nil || !stored.FilesOnly || stored.CRIUVersion != "" || stored.Files != 0 || stored.Log == nil {
		t.Fatalf("record %+v, %v; want files-only, no CRIU version or files, with the output", stored, err)
	}
	if b, err := m.Repo().ReadDeltaFile(ctx, "app", rec.Seq, "tmp/app/count"); err != nil || string(b) != "2\n" {
		t.Fatalf("data/count in the checkpoint: %q, %v; want 2", b, err)
	}
	bump(t, m, in, 4)
	noCRIU(t, marker, "a files-only checkpoint")

	if err := m.Kill(ctx, "app", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Wait(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	started := fmt.Sprintf("start restart=%d socket=/run/cairn/rank.sock count=2 files=count f1 f2 \n", rec.Seq)

	// In place, paused: made, but the command waits for Resume.
	back, err := m.Restore(ctx, "app", container.RestoreOptions{Seq: rec.Seq, Paused: true})
	if err != nil {
		t.Fatalf("files-only restore: %v", err)
	}
	if back.Status != container.StatusCreated || back.Restart != rec.Seq {
		t.Fatalf("restored paused: status %s, restart %d; want created, %d", back.Status, back.Restart, rec.Seq)
	}
	time.Sleep(500 * time.Millisecond)
	if got, err := m.Get(ctx, "app"); err != nil || got.Status != container.StatusCreated {
		t.Fatalf("before Resume: %v, %v; want created", got.Status, err)
	}
	if b, _ := os.ReadFile(back.Log); bytes.Contains(b, []byte("restart=1")) {
		t.Fatalf("the command ran before Resume:\n%s", b)
	}
	if err := m.Resume(ctx, "app"); err != nil {
		t.Fatalf("resume: %v", err)
	}
	b := waitLog(t, back.Log, 0, "the restart", func(b []byte) bool { return bytes.Contains(b, []byte(started)) })
	// The log starts with the checkpoint's output, then the new start.
	if !bytes.HasPrefix(b, []byte("start restart=none")) || !bytes.Contains(b, []byte("count=2\n"+started)) {
		t.Errorf("log after the restore:\n%s", b)
	}
	if got, err := m.Get(ctx, "app"); err != nil || got.Status != container.StatusRunning || got.StartPending {
		t.Fatalf("after Resume: %+v, %v; want running", got, err)
	}
	for _, f := range []string{"f3", "f4"} {
		if _, err := os.Stat(filepath.Join(back.RootFS, "tmp", "app", f)); err == nil {
			t.Errorf("/tmp/app/%s, written after the checkpoint, came back", f)
		}
	}
	if err := m.Resume(ctx, "app"); err != nil {
		t.Errorf("a second Resume: %v", err)
	}
	bump(t, m, back, 3)

	// As a copy, running at once.
	cp, err := m.Restore(ctx, "app", container.RestoreOptions{Seq: rec.Seq, As: "copy"})
	if err != nil {
		t.Fatalf("files-only restore as a copy: %v", err)
	}
	if cp.Status != container.StatusRunning {
		t.Errorf("copy: status %s, want running", cp.Status)
	}
	waitLog(t, cp.Log, 0, "the copy's start", func(b []byte) bool { return bytes.Contains(b, []byte(started)) })

	// Staged, as a migration moves it: prepared here, streamed, restored
	// as another container.
	p2, err := m.Prepare(ctx, "app", 0, container.PrepareOptions{FilesOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	rec2 := p2.Record()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(image.WriteStaged(pw, p2.ImageDir(), &rec2, func(int64) {})) }()
	dir := filepath.Join(env.StagingDir, "received")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	got, _, err := image.ReceiveStaged(pr, dir, 1<<30)
	if err != nil {
		t.Fatalf("receive the staged files-only image: %v", err)
	}
	if err := p2.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	moved, err := m.Restore(ctx, "app", container.RestoreOptions{As: "moved", Staged: dir, Record: &got, Paused: true})
	if err != nil {
		t.Fatalf("staged files-only restore: %v", err)
	}
	if moved.Status != container.StatusCreated {
		t.Errorf("staged restore: status %s, want created", moved.Status)
	}
	if err := m.Resume(ctx, "moved"); err != nil {
		t.Fatal(err)
	}
	waitLog(t, moved.Log, 0, "the moved start", func(b []byte) bool {
		return bytes.Contains(b, []byte(fmt.Sprintf("start restart=%d socket=/run/cairn/rank.sock count=3 files=count f1 f2 f3 \n", got.Seq)))
	})

	// One left made and never started: removed with the others, leaving
	// nothing behind (the Env's leak check).
	if left, err := m.Restore(ctx, "app", container.RestoreOptions{Seq: rec.Seq, As: "left", Paused: true}); err != nil || left.Status != container.StatusCreated {
		t.Fatalf("restore paused: %v, %v", left, err)
	}

	// A lazy restore has no memory to fetch.
	if _, err := m.Restore(ctx, "app", container.RestoreOptions{As: "lazy", Lazy: &container.Lazy{Head: &image.Head{Record: stored}, Chunks: noChunks{}}}); err == nil || !strings.Contains(err.Error(), "files-only") {
		t.Errorf("lazy restore of a files-only image = %v, want refused", err)
	}
	noCRIU(t, marker, "a files-only restore")

	// The stand-in is the Manager's CRIU: a transparent checkpoint runs
	// it, and fails.
	if _, err := m.Prepare(ctx, "copy", 0); err == nil {
		t.Fatal("a transparent prepare succeeded with a failing CRIU")
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("a transparent prepare did not run the CRIU stand-in: %v", err)
	}
}

// TestFilesOnlyUserNS: a container with a user namespace of its own, which
// CRIU cannot dump, takes files-only checkpoints, and its files come back
// with their owners.
func TestFilesOnlyUserNS(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in, err := m.Run(ctx, container.Config{Name: "u", Args: []string{"sh", "-c", counterApp}, UserNS: true})
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, in.Log, 0, "the start", func(b []byte) bool { return bytes.Contains(b, []byte("count=0")) })
	bump(t, m, in, 1)
	if _, err := m.Checkpoint(ctx, "u", container.CheckpointOptions{}); !errors.Is(err, container.ErrUserNSCheckpoint) {
		t.Fatalf("transparent checkpoint = %v, want ErrUserNSCheckpoint", err)
	}
	rec, err := m.Checkpoint(ctx, "u", container.CheckpointOptions{FilesOnly: true})
	if err != nil {
		t.Fatalf("files-only checkpoint: %v", err)
	}
	cp, err := m.Restore(ctx, "u", container.RestoreOptions{Seq: rec.Seq, As: "u2"})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	waitLog(t, cp.Log, 0, "the restart", func(b []byte) bool {
		return bytes.Contains(b, []byte(fmt.Sprintf("start restart=%d socket=none count=1 files=count f1 \n", rec.Seq)))
	})
	fi, err := os.Stat(filepath.Join(cp.RootFS, "tmp", "app", "count"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != container.UserNSBase {
		t.Errorf("restored /tmp/app/count belongs to uid %d, want %d", st.Uid, container.UserNSBase)
	}
	bump(t, m, cp, 2)
}
