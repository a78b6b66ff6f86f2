package container_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"testing"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

var (
	memsumRE  = regexp.MustCompile(`(?m)^memsum=([0-9a-f]+)$`)
	dirtiedRE = regexp.MustCompile(`(?m)^dirtied pages=(\d+)$`)
)

// signalAndWait sends sig to the container and waits for the n-th match of
// re in its log, returning its first group.
func signalAndWait(t *testing.T, env *testutil.Env, name, log string, sig syscall.Signal, re *regexp.Regexp, n int) string {
	t.Helper()
	if err := env.Manager.Kill(context.Background(), name, sig); err != nil {
		t.Fatal(err)
	}
	var got string
	waitLog(t, log, 0, re.String(), func(b []byte) bool {
		ms := re.FindAllSubmatch(b, -1)
		if len(ms) >= n {
			got = string(ms[n-1][1])
			return true
		}
		return false
	})
	return got
}

// TestSuccessiveCheckpointsStoreOnlyChanges: four checkpoints of a process
// holding 256 MiB of random data, 10% of whose pages change between
// checkpoints. Checkpoints 2-4 each store no more than 1.1x the bytes that
// changed, and each restores with its memory exactly as checkpointed.
func TestSuccessiveCheckpointsStoreOnlyChanges(t *testing.T) {
	mib := 256
	if s := os.Getenv("CAIRN_DEDUP_MIB"); s != "" {
		mib, _ = strconv.Atoi(s)
	}
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in := runStateApp(t, env, "mem", "-no-stream", "-mem", fmt.Sprint(mib), "-dirty", "10", "-dirty-every", "0", "-interval", "1h")
	waitLog(t, in.Log, 0, "ready", func(b []byte) bool { return bytes.Contains(b, []byte("ready")) })

	sums := map[int]string{}
	for i := 1; i <= 4; i++ {
		var changed int64
		if i > 1 {
			pages, _ := strconv.Atoi(signalAndWait(t, env, "mem", in.Log, syscall.SIGUSR1, dirtiedRE, i-1))
			changed = int64(pages) * 4096
		}
		sums[i] = signalAndWait(t, env, "mem", in.Log, syscall.SIGUSR2, memsumRE, i)
		rec, err := m.Checkpoint(ctx, "mem", container.CheckpointOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("checkpoint %d: image %d bytes, new %d bytes in %d chunks; changed %d bytes (ratio %.3f); stall %v, total %v",
			i, rec.Logical, rec.NewBytes, rec.NewChunks, changed, float64(rec.NewBytes)/float64(max(changed, 1)), rec.Timing.Stall, rec.Timing.Total)
		if i == 1 {
			if rec.NewBytes < int64(mib)<<20 {
				t.Fatalf("first checkpoint stored %d bytes, less than the %d MiB buffer", rec.NewBytes, mib)
			}
			continue
		}
		if rec.NewBytes > changed*11/10 {
			t.Errorf("checkpoint %d stored %d new bytes for %d changed: more than 1.1x", i, rec.NewBytes, changed)
		}
		if rec.NewBytes < changed*9/10 {
			t.Errorf("checkpoint %d stored %d new bytes for %d changed: the changes cannot all be in it", i, rec.NewBytes, changed)
		}
	}
	// Every checkpoint restores with exactly its memory.
	for i := 1; i <= 4; i++ {
		name := fmt.Sprintf("r%d", i)
		cl, err := m.Restore(ctx, "mem", container.RestoreOptions{Seq: i, As: name})
		if err != nil {
			t.Fatalf("restore checkpoint %d: %v", i, err)
		}
		before, _ := os.ReadFile(cl.Log)
		n := len(memsumRE.FindAll(before, -1))
		if got := signalAndWait(t, env, name, cl.Log, syscall.SIGUSR2, memsumRE, n+1); got != sums[i] {
			t.Errorf("checkpoint %d restored with memory %s, checkpointed %s", i, got[:12], sums[i][:12])
		}
		if err := m.Remove(ctx, name, true); err != nil {
			t.Fatal(err)
		}
	}
}
