package container_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// freezerState reads a container's freezer state straight from the cgroup,
// without any cairn code that could thaw it on the way.
func freezerState(t *testing.T, in *container.Info) string {
	t.Helper()
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/freezer", in.CgroupsPath, "freezer.state"),
		filepath.Join("/sys/fs/cgroup/unified", in.CgroupsPath, "cgroup.freeze"),
	} {
		if b, err := os.ReadFile(p); err == nil {
			s := strings.TrimSpace(string(b))
			switch s {
			case "0":
				return "THAWED"
			case "1":
				return "FROZEN"
			}
			return s
		}
	}
	t.Fatalf("no freezer for %s", in.CgroupsPath)
	return ""
}

// deadPID returns the pid of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestWatchdogReleasesAbandonedFreeze leaves a container as a killed
// checkpoint would: frozen, its network locked by cairn and by CRIU, and a
// freeze note naming a process that is gone. Without any call into cairn,
// the container's shim must thaw it, lift both locks and drop the note.
func TestWatchdogReleasesAbandonedFreeze(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	in, err := env.Manager.Run(ctx, container.Config{Name: "w", Args: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	netns := netw.NetnsPath("cairn-" + env.Manager.Instance() + "-w")
	if err := netw.LockNetns(ctx, netns); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(netns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	nft, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	nft.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "CRIU-4242"})
	if err := nft.Flush(); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(in.Dir, "frozen-by")
	note, _ := json.Marshal(map[string]any{"pid": deadPID(t), "deadline": time.Now().Add(time.Hour).Unix()})
	if err := os.WriteFile(marker, note, 0o600); err != nil {
		t.Fatal(err)
	}
	fz := filepath.Join("/sys/fs/cgroup/freezer", in.CgroupsPath, "freezer.state")
	if err := os.WriteFile(fz, []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testutil.WaitUntil(t, 5*time.Second, func() (bool, string) {
		locked, _ := netw.NetnsLocked(ctx, netns)
		tables, _ := nft.ListTables()
		criu := false
		for _, tb := range tables {
			criu = criu || tb.Name == "CRIU-4242"
		}
		_, merr := os.Stat(marker)
		st := freezerState(t, in)
		return st == "THAWED" && !locked && !criu && errors.Is(merr, os.ErrNotExist),
			fmt.Sprintf("freezer %s, cairn lock %v, CRIU table %v, note %v", st, locked, criu, merr)
	})
	t.Logf("released %v after the freeze", time.Since(start).Round(time.Millisecond))

	// A freeze whose owner still runs is left alone.
	if err := os.WriteFile(marker, []byte(fmt.Sprintf(`{"pid":%d,"deadline":%d}`, os.Getpid(), time.Now().Add(time.Hour).Unix())), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fz, []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if st := freezerState(t, in); st != "FROZEN" {
		t.Errorf("a freeze whose owner runs was undone: %s", st)
	}
	os.Remove(marker)
	os.WriteFile(fz, []byte("THAWED"), 0)
}

// TestDumpTimeout checkpoints a container one of whose processes stops
// (SIGSTOP) after cairn looked for stopped ones and before it freezes the
// container (held there by the failpoint before-freeze): CRIU hangs on
// it. The dump is killed at the dump timeout, the checkpoint fails with
// ErrDumpTimeout, nothing is listed, and the container runs on, thawed
// and unlocked.
func TestDumpTimeout(t *testing.T) {
	armed := filepath.Join(t.TempDir(), "armed")
	if err := os.WriteFile(armed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(failpoint.Env, "before-freeze")
	t.Setenv(failpoint.ArmedEnv, armed)
	var logs syncBuffer
	env := testutil.NewEnv(t, func(o *container.Options) {
		o.DumpTimeout = 2 * time.Second
		o.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), &logs), nil))
	})
	ctx := context.Background()
	m := env.Manager
	in, err := m.Run(ctx, container.Config{Name: "hang", Args: []string{"sh", "-c",
		"sleep 600 & i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	var sleeper int
	testutil.WaitUntil(t, 10*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", in.CgroupsPath, "cgroup.procs"))
		for _, p := range strings.Fields(string(b)) {
			if cmd, _ := os.ReadFile("/proc/" + p + "/cmdline"); string(cmd) == "sleep\x00600\x00" {
				sleeper, _ = strconv.Atoi(p)
				return true, ""
			}
		}
		return false, "no sleep 600 yet"
	})
	count := func() string {
		b, _ := os.ReadFile(filepath.Join(in.RootFS, "tmp/count"))
		return strings.TrimSpace(string(b))
	}
	testutil.WaitUntil(t, 10*time.Second, func() (bool, string) { return count() != "", "no count yet" })
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := m.Checkpoint(ctx, "hang", container.CheckpointOptions{})
		done <- err
	}()
	testutil.WaitUntil(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(logs.String(), "failpoint reached"), "the checkpoint did not reach before-freeze"
	})
	if err := syscall.Kill(sleeper, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, 5*time.Second, func() (bool, string) {
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", sleeper))
		i := strings.LastIndexByte(string(stat), ')')
		return i > 0 && i+2 < len(stat) && stat[i+2] == 'T', "sleep 600 not stopped yet"
	})
	os.Remove(armed)
	err = <-done
	took := time.Since(start)
	if !errors.Is(err, container.ErrDumpTimeout) || !errors.Is(err, container.ErrDumpFailed) {
		t.Fatalf("checkpoint of a hanging dump: %v (after %v), want ErrDumpTimeout", err, took)
	}
	if took > 10*time.Second {
		t.Errorf("checkpoint returned after %v with a 2s dump timeout", took)
	}
	if st := freezerState(t, in); st != "THAWED" {
		t.Fatalf("container left %s", st)
	}
	before := count()
	testutil.WaitUntil(t, 5*time.Second, func() (bool, string) {
		return count() != before, "the container does not run on after the timeout"
	})
	if recs, _ := m.Checkpoints("hang"); len(recs) != 0 {
		t.Errorf("a timed-out checkpoint is listed: %+v", recs)
	}
}

// TestCheckpointRefusesExecProcesses: a process started with Exec lives
// outside the container's init tree, where CRIU would silently leave it
// out of the image; the checkpoint refuses, names it, and the container
// runs on. Once it ends, the checkpoint goes through.
func TestCheckpointRefusesExecProcesses(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	if _, err := m.Run(ctx, container.Config{Name: "x", Args: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := m.Exec(ctx, "x", []string{"sh", "-c", "exec sleep 3"}, nil, nil, nil)
		done <- err
	}()
	in, _ := m.Get(ctx, "x")
	testutil.WaitUntil(t, 10*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", in.CgroupsPath, "cgroup.procs"))
		return len(strings.Fields(string(b))) >= 2, "no exec'd process yet"
	})
	_, err := m.Checkpoint(ctx, "x", container.CheckpointOptions{})
	if !errors.Is(err, container.ErrExecProcesses) || !strings.Contains(err.Error(), "(sleep)") {
		t.Fatalf("checkpoint with an exec'd process: %v, want ErrExecProcesses naming it", err)
	}
	if st := freezerState(t, in); st != "THAWED" {
		t.Fatalf("container left %s", st)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := m.Checkpoint(ctx, "x", container.CheckpointOptions{}); err != nil {
		t.Fatalf("checkpoint once the exec'd process ended: %v", err)
	}
}

// TestCheckpointRefusesStoppedProcesses: a container holding a process
// stopped by SIGSTOP, which CRIU would wait for until the dump timeout,
// is refused at once with the process named; the container runs on
// (thawed), and once the process is continued the checkpoint is taken.
func TestCheckpointRefusesStoppedProcesses(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	if _, err := m.Run(ctx, container.Config{Name: "x", Args: []string{"sh", "-c", "sleep 600 & sleep 0.3; kill -STOP $!; wait"}}); err != nil {
		t.Fatal(err)
	}
	in, _ := m.Get(ctx, "x")
	var stopped int
	testutil.WaitUntil(t, 10*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", in.CgroupsPath, "cgroup.procs"))
		for _, s := range strings.Fields(string(b)) {
			stat, _ := os.ReadFile("/proc/" + s + "/stat")
			if i := strings.LastIndexByte(string(stat), ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'T' {
				stopped, _ = strconv.Atoi(s)
				return true, ""
			}
		}
		return false, "no stopped process yet"
	})
	start := time.Now()
	_, err := m.Checkpoint(ctx, "x", container.CheckpointOptions{})
	if !errors.Is(err, container.ErrStoppedProcesses) || !strings.Contains(err.Error(), fmt.Sprintf("(%d on the host, sleep) stopped by a signal", stopped)) {
		t.Fatalf("checkpoint with a stopped process: %v, want ErrStoppedProcesses naming it", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("refused after %v: CRIU was given the stopped process", d)
	}
	t.Logf("refused in %v: %v", time.Since(start).Round(time.Millisecond), err)
	if st := freezerState(t, in); st != "THAWED" {
		t.Fatalf("container left %s", st)
	}
	if err := syscall.Kill(stopped, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Checkpoint(ctx, "x", container.CheckpointOptions{}); err != nil {
		t.Fatalf("checkpoint once the process was continued: %v", err)
	}
}

// syncBuffer is a bytes.Buffer for several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
