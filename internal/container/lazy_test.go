package container_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cairn/internal/container"
	"cairn/internal/image"
	"cairn/internal/store"
	"cairn/internal/testutil"
)

// checkpointedApp runs stateapp holding mib MiB of random memory (with
// streaming, until it has streamed 300 messages), stops it with a
// checkpoint, and returns the head of that checkpoint and the
// store to take its chunks from, as a lazy restore needs them.
func checkpointedApp(t *testing.T, env *testutil.Env, mib int, streaming bool) (*image.Head, *store.Store) {
	t.Helper()
	ctx := context.Background()
	in := runStateApp(t, env, "app", "-mem", strconv.Itoa(mib), "-dirty-every", "0")
	ready := fmt.Sprintf("mem=%dMiB ready", mib)
	waitLog(t, in.Log, 0, "memory", func(b []byte) bool { return bytes.Contains(b, []byte(ready)) })
	if streaming {
		waitStreaming(t, in.Log, 0, 300)
	}
	if _, err := env.Manager.Checkpoint(ctx, "app", container.CheckpointOptions{Stop: true}); err != nil {
		t.Fatal(err)
	}
	head, st, err := env.Manager.Repo().Head(ctx, "app", 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return head, st
}

// TestLazyRestore restores a copy of a process holding 64 MiB of random
// memory lazily: CRIU's lazy-pages daemon takes its pages from cairn's
// page server as the copy runs. The copy's memory must hash as the
// original's did at the checkpoint, and the page server must have served
// most of it (the restore itself wrote only the eager pages).
func TestLazyRestore(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	head, st := checkpointedApp(t, env, 64, true)
	// The checksum at the checkpoint: from a copy restored as usual.
	ref, err := env.Manager.Restore(ctx, "app", container.RestoreOptions{Seq: 1, As: "ref"})
	if err != nil {
		t.Fatal(err)
	}
	want := signalAndWait(t, env, "ref", ref.Log, syscall.SIGUSR2, memsumRE, 1)
	if err := env.Manager.Remove(ctx, "ref", true); err != nil {
		t.Fatal(err)
	}

	done := make(chan container.LazyStats, 1)
	lz := &container.Lazy{Head: head, Chunks: st, Done: func(s container.LazyStats, err error) {
		if err != nil {
			t.Errorf("lazy restore: %v", err)
		}
		done <- s
	}}
	clone, err := env.Manager.Restore(ctx, "app", container.RestoreOptions{As: "clone", Lazy: lz})
	if err != nil {
		t.Fatal(err)
	}
	var stats container.LazyStats
	select {
	case stats = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the lazy restore did not complete in 60 s")
	}
	if got := signalAndWait(t, env, "clone", clone.Log, syscall.SIGUSR2, memsumRE, 1); got != want {
		t.Fatalf("memory of the lazy copy hashes to %s, want %s", got, want)
	}
	if stats.Pages < 64<<20/4096 {
		t.Fatalf("the page server served %d pages, want at least the 64 MiB buffer's %d", stats.Pages, 64<<20/4096)
	}
	b, _ := os.ReadFile(clone.Log)
	waitStreaming(t, clone.Log, len(b), lastRecv(b)+300)
	t.Logf("served %d pages in %d requests, %v", stats.Pages, stats.Requests, stats.Took)
}

// failingChunks fails every request once fail is set: the holders are gone.
type failingChunks struct {
	st   *store.Store
	fail *atomic.Bool
}

func (c failingChunks) GetSeq(ctx context.Context, ids []store.ID, fn func([]byte) error) error {
	if c.fail.Load() {
		return errors.New("no holder serves the image any more")
	}
	return c.st.GetSeq(ctx, ids, fn)
}

// TestLazyRestoreLosesItsPages: a lazily restored container whose pages
// cannot be had any more (every holder gone) must not run on, since its
// memory that had not arrived would read as zeros: the shim kills it and
// says why.
func TestLazyRestoreLosesItsPages(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	head, st := checkpointedApp(t, env, 256, false)
	var fail atomic.Bool
	done := make(chan error, 1)
	lz := &container.Lazy{Head: head, Chunks: failingChunks{st, &fail}, Done: func(_ container.LazyStats, err error) { done <- err }}
	// Paused, as a rank is restored: nothing touches the memory, only the
	// daemon's background requests ask for it.
	if _, err := env.Manager.Restore(ctx, "app", container.RestoreOptions{Lazy: lz, Paused: true}); err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the lazy restore completed although its pages could not be had")
		}
		t.Logf("lazy restore: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the lazy restore did not end in 60 s")
	}
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		got, err := env.Manager.Get(ctx, "app")
		if err != nil {
			return false, err.Error()
		}
		if got.Exit == nil {
			return false, "container still " + string(got.Status)
		}
		return strings.Contains(got.Exit.Reason, "lazy restore failed"), fmt.Sprintf("exit %+v", *got.Exit)
	})
}
