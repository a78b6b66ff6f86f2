package container_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/testutil"
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

// lazyOutcome returns a Lazy.Done that fails the test if the lazy restore
// fails, and wait, which returns the restore's stats once every page is
// there, failing the test after 60 s.
func lazyOutcome(t *testing.T) (func(container.LazyStats, error), func() container.LazyStats) {
	done := make(chan container.LazyStats, 1)
	onDone := func(s container.LazyStats, err error) {
		if err != nil {
			t.Errorf("lazy restore: %v", err)
		}
		done <- s
	}
	wait := func() container.LazyStats {
		t.Helper()
		select {
		case s := <-done:
			return s
		case <-time.After(60 * time.Second):
			t.Fatal("the lazy restore did not complete in 60 s")
		}
		return container.LazyStats{}
	}
	return onDone, wait
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

	onDone, wait := lazyOutcome(t)
	lz := &container.Lazy{Head: head, Chunks: st, Done: onDone}
	clone, err := env.Manager.Restore(ctx, "app", container.RestoreOptions{As: "clone", Lazy: lz})
	if err != nil {
		t.Fatal(err)
	}
	stats := wait()
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

// gatedChunks serves a lazy restore's chunks from a store, but once
// closed is set, holds every request for more than one page (the
// prefetch's, the daemon's background requests) until gate is closed:
// the process runs, each page it touches is served as it faults, and
// the rest of its memory has not arrived. (Were faults held too, its
// threads would wait in the kernel for their pages, and the freezer
// cannot freeze them there.)
type gatedChunks struct {
	st     *store.Store
	closed atomic.Bool
	gate   chan struct{}
}

func (c *gatedChunks) GetSeq(ctx context.Context, ids []store.ID, fn func([]byte) error) error {
	if len(ids) > 1 && c.closed.Load() {
		select {
		case <-c.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return c.st.GetSeq(ctx, ids, fn)
}

// lazyRestoreGated checkpoints (and stops) a process holding mib MiB of
// random memory, notes its memory's hash from a copy restored as usual,
// then restores it lazily under its own name from chunks that stop
// arriving as soon as the restore returns: until the test opens the
// gate, most of its memory is missing. done gets the lazy restore's
// outcome. paused leaves it frozen, as a rank is restored.
func lazyRestoreGated(t *testing.T, env *testutil.Env, mib int, paused bool) (want string, in *container.Info, gc *gatedChunks, done chan error) {
	t.Helper()
	ctx := context.Background()
	head, st := checkpointedApp(t, env, mib, false)
	ref, err := env.Manager.Restore(ctx, "app", container.RestoreOptions{Seq: 1, As: "ref"})
	if err != nil {
		t.Fatal(err)
	}
	want = signalAndWait(t, env, "ref", ref.Log, syscall.SIGUSR2, memsumRE, 1)
	if err := env.Manager.Remove(ctx, "ref", true); err != nil {
		t.Fatal(err)
	}
	gc = &gatedChunks{st: st, gate: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-gc.gate:
		default:
			close(gc.gate)
		}
	})
	done = make(chan error, 1)
	lz := &container.Lazy{Head: head, Chunks: gc, Done: func(_ container.LazyStats, err error) { done <- err }}
	in, err = env.Manager.Restore(ctx, "app", container.RestoreOptions{Lazy: lz, Paused: paused})
	gc.closed.Store(true)
	if err != nil {
		t.Fatal(err)
	}
	return want, in, gc, done
}

// TestLazyRestoreDumpedAtOnce: a process holding 256 MiB of random
// memory is restored lazily and checkpointed at once, while most of its
// pages have not arrived. The checkpoint must hold the whole memory: a
// copy restored from it hashes as the original did.
func TestLazyRestoreDumpedAtOnce(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	want, _, gc, done := lazyRestoreGated(t, env, 256, false)
	time.AfterFunc(2*time.Second, func() { close(gc.gate) })
	rec, err := env.Manager.Checkpoint(ctx, "app", container.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint %s: stall %v, total %v", rec.Name(), rec.Timing.Stall, rec.Timing.Total)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("lazy restore: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the lazy restore did not complete in 60 s")
	}
	cp, err := env.Manager.Restore(ctx, "app", container.RestoreOptions{Seq: rec.Seq, As: "copy"})
	if err != nil {
		t.Fatal(err)
	}
	if got := signalAndWait(t, env, "copy", cp.Log, syscall.SIGUSR2, memsumRE, 1); got != want {
		t.Fatalf("checkpoint %s restores with memory %s, the original's is %s", rec.Name(), got[:12], want[:12])
	}
}

// TestLazyCheckpointRefusedInTime: a checkpoint of a lazily restored
// process whose pages do not arrive within its bound fails with
// ErrMemoryIncomplete, lists nothing, and leaves the process running;
// once its pages have come, its memory is whole.
func TestLazyCheckpointRefusedInTime(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	want, in, gc, done := lazyRestoreGated(t, env, 64, false)
	start := time.Now()
	_, err := env.Manager.Checkpoint(ctx, "app", container.CheckpointOptions{MemoryWait: time.Second})
	if !errors.Is(err, container.ErrMemoryIncomplete) {
		t.Fatalf("checkpoint while pages are missing: %v, want ErrMemoryIncomplete", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the refusal took %v with a bound of 1 s", took)
	}
	t.Logf("refused: %v", err)
	if list, err := env.Manager.Checkpoints("app"); err != nil || len(list) != 1 {
		t.Fatalf("checkpoints after the refusal: %d (%v), want only the first", len(list), err)
	}
	close(gc.gate)
	if err := <-done; err != nil {
		t.Fatalf("lazy restore: %v", err)
	}
	if got := signalAndWait(t, env, "app", in.Log, syscall.SIGUSR2, memsumRE, 1); got != want {
		t.Fatalf("memory after the lazy restore hashes to %s, want %s", got[:12], want[:12])
	}
}

// TestDumpRefusesMissingMemory: a second Manager on the same data dir
// (another cairn process) knows nothing of the first's lazy restore and
// does not wait for it; the kernel still tells that the process's memory
// is registered for pages that have not arrived, and the checkpoint is
// refused rather than written with zeros. (The process is restored
// frozen: one of its threads waiting in a fault for a page that does not
// come could not be frozen for the dump.)
func TestDumpRefusesMissingMemory(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	_, _, gc, done := lazyRestoreGated(t, env, 64, true)
	other, err := container.New(container.Options{DataDir: env.DataDir, StagingDir: env.StagingDir, Bridge: env.Bridge,
		ShimCommand: []string{os.Args[0], "shim"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.Checkpoint(ctx, "app", container.CheckpointOptions{})
	if !errors.Is(err, container.ErrMemoryIncomplete) || !strings.Contains(err.Error(), "userfaultfd") {
		t.Fatalf("checkpoint by another Manager while pages are missing: %v, want ErrMemoryIncomplete from the kernel's check", err)
	}
	t.Logf("refused: %v", err)
	close(gc.gate)
	if err := <-done; err != nil {
		t.Fatalf("lazy restore: %v", err)
	}
	// Every page here: the other Manager's checkpoint goes through.
	if _, err := other.Checkpoint(ctx, "app", container.CheckpointOptions{}); err != nil {
		t.Fatalf("checkpoint once every page is here: %v", err)
	}
}

// filePages reads pages from the pages files of a staged image, as a
// post-copy migration's source serves them, counting what it served.
type filePages struct {
	dir    string
	served atomic.Int64
}

func (p *filePages) ReadPages(_ context.Context, file string, pages []int64, fn func([]byte) error) error {
	f, err := os.Open(filepath.Join(p.dir, file))
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 4096)
	for _, k := range pages {
		if _, err := f.ReadAt(b, k*4096); err != nil {
			return err
		}
		if err := fn(b); err != nil {
			return err
		}
		p.served.Add(1)
	}
	return nil
}

// TestLazyRestoreStaged restores a copy of a process holding 64 MiB of
// random memory as a post-copy migration does: from its prepared image
// sent without its pages (image.WriteStagedLazy), the pages read from the
// prepared image's pages files as the copy runs. The copy's memory must
// hash as the original's, and most of it must have come through the
// reader after the restore.
func TestLazyRestoreStaged(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	in := runStateApp(t, env, "app", "-mem", "64", "-dirty-every", "0")
	waitLog(t, in.Log, 0, "memory", func(b []byte) bool { return bytes.Contains(b, []byte("mem=64MiB ready")) })
	want := signalAndWait(t, env, "app", in.Log, syscall.SIGUSR2, memsumRE, 1)
	p, err := env.Manager.Prepare(ctx, "app", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Abort(ctx)
	var stream bytes.Buffer
	rec := p.Record()
	var announced int64
	if err := image.WriteStagedLazy(&stream, p.ImageDir(), &rec, func(n int64) { announced = n }); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(env.Manager.StagingDir(), "postcopy-test")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	got, n, err := image.ReceiveStaged(&stream, dir, announced)
	if err != nil {
		t.Fatal(err)
	}
	if n >= 64<<20 {
		t.Fatalf("the stream without pages carried %d bytes", n)
	}
	src := &filePages{dir: filepath.Join(p.ImageDir(), image.CRIUDir)}
	onDone, wait := lazyOutcome(t)
	lz := &container.Lazy{Pages: src, Done: onDone}
	clone, err := env.Manager.Restore(ctx, "app", container.RestoreOptions{As: "clone", Staged: dir, Record: &got, Lazy: lz})
	if err != nil {
		t.Fatal(err)
	}
	stats := wait()
	// The copy's log starts with the original's, which holds one sum.
	if got := signalAndWait(t, env, "clone", clone.Log, syscall.SIGUSR2, memsumRE, 2); got != want {
		t.Fatalf("memory of the copy hashes to %s, want %s", got, want)
	}
	if stats.Pages < 64<<20/4096 || src.served.Load() < 64<<20/4096 {
		t.Fatalf("the page server served %d pages, the reader %d: want at least the 64 MiB buffer's %d", stats.Pages, src.served.Load(), 64<<20/4096)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the staged dir is still there once every page arrived: %v", err)
	}
}
