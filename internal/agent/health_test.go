package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/proc"
)

// TestHealth: each probe fails when it should and says why; a change of
// the failing set is reported once.
func TestHealth(t *testing.T) {
	dir := t.TempDir()
	flag := filepath.Join(dir, "sick")
	h := NewHealth(HealthConfig{
		Every: 20 * time.Millisecond, Node: "n7",
		Command: `if [ -e ` + flag + ` ]; then echo "$CAIRN_NODE is sick"; exit 1; fi`,
		DataDir: dir, MinFreeDisk: 1.01, // never enough
	})
	w := h.Check(context.Background())
	if len(w) != 1 || !strings.HasPrefix(w[0], "disk: ") {
		t.Fatalf("warnings %q, want the disk probe only", w)
	}
	h.cfg.MinFreeDisk = 0
	if w := h.Check(context.Background()); len(w) != 0 {
		t.Fatalf("healthy node warns %q", w)
	}
	changes := make(chan []string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.Run(ctx, func(w []string) { changes <- w })
	if w := <-changes; len(w) != 0 {
		t.Fatalf("first report %q", w)
	}
	os.WriteFile(flag, nil, 0o600)
	if w := <-changes; !slices.Equal(w, []string{"command: n7 is sick"}) {
		t.Fatalf("sick node reports %q", w)
	}
	os.Remove(flag)
	if w := <-changes; len(w) != 0 {
		t.Fatalf("recovered node reports %q", w)
	}
	select {
	case w := <-changes:
		t.Fatalf("a report without a change: %q", w)
	case <-time.After(100 * time.Millisecond):
	}
	mem := NewHealth(HealthConfig{MinFreeMemory: 1.01})
	if w := mem.Check(context.Background()); len(w) != 1 || !strings.HasPrefix(w[0], "memory: ") {
		t.Fatalf("memory probe: %q", w)
	}
}

// TestHealthCommandTimeout: a probe command that hangs, with a child that
// holds its output open, fails at its timeout with everything it started
// killed, and the probes go on.
func TestHealthCommandTimeout(t *testing.T) {
	dir := t.TempDir()
	pidFile, hang := filepath.Join(dir, "pid"), filepath.Join(dir, "hang")
	if err := os.WriteFile(hang, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h := NewHealth(HealthConfig{Every: 50 * time.Millisecond, Timeout: time.Second,
		Command: fmt.Sprintf(`if [ -e %s ]; then sleep 30 & echo $! > %s; exec sleep 30; fi`, hang, pidFile)})
	changes := make(chan []string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx, func(w []string) { changes <- w }); close(done) }()
	defer func() { cancel(); <-done }()
	child := readProbePID(t, pidFile)
	select {
	case w := <-changes:
		// Its own timeout ended it: the command would hang for 30 s.
		if want := []string{"command: timed out after 1s"}; !slices.Equal(w, want) {
			t.Errorf("hung probe reports %q, want %q", w, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a hung probe: no report within 5s")
	}
	waitProbe(t, "the probe's child to be gone", func() bool { return !proc.Runs(child) })
	// The probes go on: once the command stops hanging, the node is well.
	os.Remove(hang)
	select {
	case w := <-changes:
		if len(w) != 0 {
			t.Fatalf("recovered node reports %q", w)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no report once the probe stopped hanging")
	}
}

func waitProbe(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for " + what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readProbePID waits for a pid written to file by a command under test, and
// kills it when the test ends if it still runs.
func readProbePID(t *testing.T, file string) int {
	t.Helper()
	var pid int
	waitProbe(t, "the pid in "+file, func() bool {
		b, err := os.ReadFile(file)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	t.Cleanup(func() {
		if proc.Runs(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return pid
}
