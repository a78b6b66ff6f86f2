package container_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// keptEnv is a test env whose Manager keeps images up to budget bytes,
// running the counter as "count".
func keptEnv(t *testing.T, budget int64) (*testutil.Env, *container.Info) {
	t.Helper()
	env := testutil.NewEnv(t, func(o *container.Options) { o.KeepImages = budget })
	in, err := env.Manager.Run(context.Background(), container.Config{Name: "count", Args: counterArgs})
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, in.Log, 0, "5 lines", atLeast(5))
	return env, in
}

// storeAway moves the store out of reach until the returned function puts
// it back: a restore that still works reads nothing from it.
func storeAway(t *testing.T, env *testutil.Env) (back func()) {
	t.Helper()
	st := env.Manager.Repo().StoreDir
	if err := os.Rename(st, st+".away"); err != nil {
		t.Fatal(err)
	}
	done := false
	back = func() {
		if !done {
			done = true
			if err := os.Rename(st+".away", st); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(back)
	return back
}

func killCount(t *testing.T, env *testutil.Env) {
	t.Helper()
	if err := env.Manager.Kill(context.Background(), "count", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreFromKeptImage: the newest checkpoint's image stays in
// staging, and a restore of that checkpoint on the node runs with the
// store out of reach; the kept image serves once; an older checkpoint is
// never taken from it; removing the container drops it.
func TestRestoreFromKeptImage(t *testing.T) {
	ctx := context.Background()
	env, in := keptEnv(t, 1<<30)
	m := env.Manager
	rec1, err := m.Checkpoint(ctx, "count", container.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec2, err := m.Checkpoint(ctx, "count", container.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(env.StagingDir, "kept", "count")
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("no kept image after a checkpoint: %v", err)
	}
	killCount(t, env)
	back := storeAway(t, env)

	// Checkpoint 1 is not the kept one: it needs the store.
	if _, err := m.Restore(ctx, "count", container.RestoreOptions{Seq: rec1.Seq}); err == nil {
		t.Fatal("checkpoint 1 restored without its store: it was taken from checkpoint 2's kept image")
	}
	// Checkpoint 2 is: no store needed.
	in, err = m.Restore(ctx, "count", container.RestoreOptions{Seq: rec2.Seq})
	if err != nil {
		t.Fatalf("restore of the kept checkpoint without the store: %v", err)
	}
	b, _ := os.ReadFile(in.Log)
	waitLog(t, in.Log, len(b), "5 more lines after the restore", atLeast(5))
	if _, err := os.Stat(kept); !os.IsNotExist(err) {
		t.Fatalf("the kept image is still there after the restore used it: %v", err)
	}

	// Used up: the next restore needs the store again.
	killCount(t, env)
	if _, err := m.Restore(ctx, "count", container.RestoreOptions{Seq: rec2.Seq}); err == nil {
		t.Fatal("a second restore without the store succeeded")
	}
	back()
	if in, err = m.Restore(ctx, "count", container.RestoreOptions{Seq: rec2.Seq}); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(in.Log)
	waitLog(t, in.Log, len(b), "5 more lines after the restore from the store", atLeast(5))

	// A checkpoint keeps again; rm drops it.
	if _, err := m.Checkpoint(ctx, "count", container.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("no kept image after the next checkpoint: %v", err)
	}
	if err := m.Remove(ctx, "count", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(kept); !os.IsNotExist(err) {
		t.Fatalf("rm left the kept image: %v", err)
	}
}

// TestKeptImageBudget: an image larger than the budget is not kept.
func TestKeptImageBudget(t *testing.T) {
	ctx := context.Background()
	env, _ := keptEnv(t, 4096)
	if _, err := env.Manager.Checkpoint(ctx, "count", container.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(env.StagingDir, "kept")); len(ents) != 0 {
		t.Fatalf("an image above the 4 KiB budget was kept: %v", ents)
	}
	killCount(t, env)
	storeAway(t, env)
	if _, err := env.Manager.Restore(ctx, "count", container.RestoreOptions{}); err == nil {
		t.Fatal("restored without the store or a kept image")
	}
}
