package container_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestCheckpointKillRestore is the foundation: a program with memory state,
// a file it appends to and a busy TCP connection between two of its
// processes survives checkpoint → kill → restore, with everything the
// container wrote or deleted after the checkpoint rolled back.
func TestCheckpointKillRestore(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in := runStateApp(t, env, "app")
	addr := in.Addr
	waitStreaming(t, in.Log, 0, 2000)

	// A file that will be deleted after the checkpoint, with content, mode,
	// owner and an xattr that must all come back.
	keep := filepath.Join(in.RootFS, "root/keep.bin")
	content := make([]byte, 200_000)
	rand.Read(content)
	if err := os.WriteFile(keep, content, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(keep, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(keep, "user.cairn", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	// A file of the lower layer (the host's /) deleted before the
	// checkpoint: it must stay deleted (a whiteout in the delta).
	if err := os.Remove(filepath.Join(in.RootFS, "etc/hostname")); err != nil {
		t.Fatal(err)
	}

	man, err := m.Checkpoint(ctx, "app", container.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if man.Timing.Stall <= 0 || man.Size() == 0 || man.Delta.Whiteouts == 0 {
		t.Fatalf("manifest: %+v", man)
	}
	atCkpt := ckptCount(t, env, "app", man.Seq)
	if len(atCkpt) == 0 {
		t.Fatal("checkpoint holds an empty count.log")
	}

	// Still running after the checkpoint: the stream goes on.
	in, _ = m.Get(ctx, "app")
	if in.Status != container.StatusRunning {
		t.Fatalf("after checkpoint: status %s", in.Status)
	}
	b, _ := os.ReadFile(in.Log)
	waitStreaming(t, in.Log, len(b), lastRecv(b)+2000)
	time.Sleep(200 * time.Millisecond) // let the counter move past the checkpoint

	// After the checkpoint: delete keep.bin, write new.txt; then kill.
	if err := os.Remove(keep); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(in.RootFS, "root/new.txt"), []byte("after\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	preKill := readCount(t, in)
	if err := m.Kill(ctx, "app", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if len(preKill) <= len(atCkpt) {
		t.Fatalf("counter did not move after the checkpoint (%d <= %d)", len(preKill), len(atCkpt))
	}
	if in, _ = m.Get(ctx, "app"); in.Status != container.StatusExited {
		t.Fatalf("after kill: status %s", in.Status)
	}

	logBefore, _ := os.ReadFile(in.Log)
	in, err = m.Restore(ctx, "app", container.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != container.StatusRunning || in.RestoredFrom != "app:1" {
		t.Fatalf("after restore: %+v", in)
	}
	// The TCP stream goes on from where it was: the receiver checks every
	// message's sequence number, content and checksum, so a lost or
	// duplicated message makes it print FAIL and exit.
	recvAtCkpt := lastRecv(logBefore) // an upper bound on the checkpoint's value
	waitStreaming(t, in.Log, len(logBefore), recvAtCkpt+3000)

	// The counter continues from the checkpoint's value: count.log starts
	// with exactly the checkpoint's lines, then goes on without a gap; the
	// lines written between checkpoint and kill are gone (their timestamps
	// differ from the re-made ones).
	time.Sleep(200 * time.Millisecond)
	now := readCount(t, in)
	if len(now) <= len(atCkpt) {
		t.Fatalf("counter did not go on after restore: %d lines, checkpoint had %d", len(now), len(atCkpt))
	}
	for i := range atCkpt {
		if now[i] != atCkpt[i] {
			t.Fatalf("count.log line %d = %q, checkpoint had %q", i+1, now[i], atCkpt[i])
		}
	}
	checkContiguous(t, now)
	if now[len(atCkpt)] == preKill[len(atCkpt)] {
		t.Fatalf("line %d survived the restore: the post-checkpoint writes were not rolled back", len(atCkpt)+1)
	}

	// Files: new.txt gone, keep.bin back byte for byte with its metadata,
	// /etc/hostname still deleted.
	if _, err := os.Stat(filepath.Join(in.RootFS, "root/new.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("new.txt after restore: %v, want it gone", err)
	}
	got, err := os.ReadFile(keep)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("keep.bin after restore: %v, equal=%v", err, bytes.Equal(got, content))
	}
	var st unix.Stat_t
	if err := unix.Stat(keep, &st); err != nil || st.Mode&0o777 != 0o640 || st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("keep.bin metadata: mode %o uid %d gid %d (%v)", st.Mode&0o777, st.Uid, st.Gid, err)
	}
	x := make([]byte, 16)
	if n, err := unix.Getxattr(keep, "user.cairn", x); err != nil || string(x[:n]) != "kept" {
		t.Errorf("keep.bin xattr: %q, %v", x[:max(n, 0)], err)
	}
	if _, err := os.Stat(filepath.Join(in.RootFS, "etc/hostname")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/etc/hostname came back: %v", err)
	}
	if in.Addr != addr {
		t.Errorf("address after restore %s, before %s", in.Addr, addr)
	}
}
