package container_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// counterArgs prints "line N" every 50 ms, N from 1.
var counterArgs = []string{"sh", "-c", `i=0; while :; do i=$((i+1)); echo "line $i"; sleep 0.05; done`}

var counterRE = regexp.MustCompile(`^line (\d+)$`)

// counted parses a counter's output, checking that it counts 1, 2, 3, ...
// without a gap or a repeat and ends with a whole line; it returns the
// last number.
func counted(t *testing.T, what string, b []byte) int {
	t.Helper()
	if len(b) == 0 {
		return 0
	}
	if b[len(b)-1] != '\n' {
		t.Fatalf("%s ends in the middle of a line: %q", what, tail(b, 40))
	}
	for i, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		m := counterRE.FindStringSubmatch(l)
		if m == nil || m[1] != strconv.Itoa(i+1) {
			t.Fatalf("%s: line %d is %q, want \"line %d\" (a gap or a repeat)\n%s", what, i+1, l, i+1, tail(b, 400))
		}
	}
	return bytes.Count(b, []byte("\n"))
}

// atLeast is a waitLog condition: the counter has printed n lines.
func atLeast(n int) func([]byte) bool {
	return func(b []byte) bool { return bytes.Count(b, []byte("\n")) >= n }
}

// frozen reports whether a cgroup is frozen (cgroup v1 or v2).
func frozen(cgroupsPath string) bool {
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", cgroupsPath, "freezer.state")); err == nil {
		return strings.TrimSpace(string(b)) == "FROZEN"
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if b, err := os.ReadFile(filepath.Join(root, cgroupsPath, "cgroup.events")); err == nil {
			return bytes.Contains(b, []byte("frozen 1"))
		}
	}
	return false
}

// checkpointLog returns the output kept with a checkpoint.
func checkpointLog(t *testing.T, env *testutil.Env, rec *image.Record) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "log")
	ok, err := env.Manager.Repo().MaterializeLog(context.Background(), rec, p)
	if err != nil || !ok {
		t.Fatalf("output of %s: kept %v, %v", rec.Name(), ok, err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRestoredLogContinues: a restored container's log reads exactly as an
// uninterrupted run's: the output up to the checkpoint (including what
// was still in the pipe when the container froze), then what the restored
// processes print. What the killed incarnation printed after the
// checkpoint is kept apart as incarnation 1. A copy restored with --as
// starts with the same history.
func TestRestoredLogContinues(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in, err := m.Run(ctx, container.Config{Name: "count", Args: counterArgs})
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, in.Log, 0, "10 lines", atLeast(10))

	// Hold the shim so that lines pile up in the pipe, and let it go only
	// well after the container froze: what the pipe holds then was printed
	// before the checkpoint and belongs to it.
	if err := syscall.Kill(in.ShimPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(in.ShimPID, syscall.SIGCONT) })
	time.Sleep(400 * time.Millisecond)
	b, _ := os.ReadFile(in.Log)
	beforeHold := bytes.Count(b, []byte("\n"))
	released := make(chan struct{})
	go func() {
		defer close(released)
		for deadline := time.Now().Add(20 * time.Second); !frozen(in.CgroupsPath) && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		_ = syscall.Kill(in.ShimPID, syscall.SIGCONT)
	}()
	rec1, err := m.Checkpoint(ctx, "count", container.CheckpointOptions{})
	<-released
	if err != nil {
		t.Fatal(err)
	}
	kept := checkpointLog(t, env, rec1)
	k := counted(t, "checkpoint 1's log", kept)
	t.Logf("checkpoint 1 kept %d lines, %d of them read by the shim before it was held", k, beforeHold)
	if k < beforeHold+4 {
		t.Fatalf("checkpoint 1 kept %d lines; %d were in the log when the shim stopped reading, and the pipe held ~8 more", k, beforeHold)
	}
	if rec1.Log == nil || rec1.Log.Incarnation != 1 || rec1.Log.Bytes != int64(len(kept)) {
		t.Fatalf("record of checkpoint 1 says %+v of its output, kept %d bytes", rec1.Log, len(kept))
	}

	// It goes on printing past the checkpoint, then dies.
	waitLog(t, in.Log, 0, "lines past the checkpoint", atLeast(k+10))
	if err := m.Kill(ctx, "count", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	died, _ := os.ReadFile(in.Log)
	last := counted(t, "the killed incarnation's log", died)

	in, err = m.Restore(ctx, "count", container.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := waitLog(t, in.Log, 0, "the restored counter", atLeast(k+10))
	if !bytes.HasPrefix(now, kept) {
		t.Fatalf("the restored log does not start with checkpoint 1's output")
	}
	counted(t, "the restored log", now)

	incs, err := m.Incarnations("count")
	if err != nil {
		t.Fatal(err)
	}
	if len(incs) != 2 || incs[0].N != 1 || incs[0].Current || incs[1].N != 2 || !incs[1].Current ||
		incs[1].RestoredFrom != "count:1" || incs[1].Restored != int64(len(kept)) || incs[0].Exit == nil || incs[0].Exit.Signal != "SIGKILL" {
		t.Fatalf("incarnations: %+v", incs)
	}
	p, err := m.IncarnationLog("count", 1)
	if err != nil {
		t.Fatal(err)
	}
	if first, _ := os.ReadFile(p); !bytes.Equal(first, died) || counted(t, "incarnation 1's log", first) != last {
		t.Fatalf("incarnation 1's log is not the killed incarnation's (%d bytes, it had %d)", len(first), len(died))
	}
	if _, err := m.IncarnationLog("count", 3); !errors.Is(err, container.ErrNotFound) {
		t.Fatalf("log of incarnation 3: %v, want ErrNotFound", err)
	}

	// A copy has the same history, and counts on from the checkpoint.
	cp, err := m.Restore(ctx, "count", container.RestoreOptions{Seq: 1, As: "copy"})
	if err != nil {
		t.Fatal(err)
	}
	cl := waitLog(t, cp.Log, 0, "the copy's counter", atLeast(k+5))
	if !bytes.HasPrefix(cl, kept) {
		t.Fatalf("the copy's log does not start with checkpoint 1's output")
	}
	counted(t, "the copy's log", cl)
	if incs, err := m.Incarnations("copy"); err != nil || len(incs) != 1 || incs[0].N != 2 || incs[0].RestoredFrom != "count:1" {
		t.Fatalf("the copy's incarnations: %+v, %v", incs, err)
	}

	// A checkpoint of the restored container keeps its whole history and
	// says which incarnation it was taken in.
	rec2, err := m.Checkpoint(ctx, "count", container.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kept2 := checkpointLog(t, env, rec2)
	if !bytes.HasPrefix(kept2, kept) || counted(t, "checkpoint 2's log", kept2) <= k || rec2.Log.Incarnation != 2 {
		t.Fatalf("checkpoint 2 kept %d bytes (incarnation %d), checkpoint 1 %d", len(kept2), rec2.Log.Incarnation, len(kept))
	}
}
