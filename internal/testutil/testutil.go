package testutil

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/netw"
)

// RequiresRoot skips t unless it runs as root.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root (namespaces, runc, CRIU)")
	}
}

// Main runs a test binary's tests. A test binary started as a container's
// shim runs the shim instead; the cairn binary built for the tests is
// removed afterwards.
func Main(m *testing.M) {
	if os.Getenv(container.ShimEnv) != "" {
		os.Exit(container.ShimMain())
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// CairnBinary builds cmd/cairn once per test process and returns its path.
// It lives on the root file system, so containers whose lower layer is the
// host's / can run it (cairn stateapp).
func CairnBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("/var/tmp", "cairn-test-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "cairn")
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/cairn")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/cairn: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// Env is a private place for one test's containers.
type Env struct {
	DataDir    string
	StagingDir string
	Bridge     netw.Bridge
	Manager    *container.Manager
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NewEnv returns a Manager with its own data dir, staging dir, bridge and
// /24 subnet, and registers a cleanup that removes every container, the
// bridge and the dirs, then checks that nothing of the test is left.
// Options in mod are applied before the Manager is made.
func NewEnv(t testing.TB, mod ...func(*container.Options)) *Env {
	t.Helper()
	RequiresRoot(t)
	id := randHex(3)
	e := &Env{
		DataDir:    t.TempDir(),
		StagingDir: filepath.Join("/dev/shm", "cairn-test-"+id),
		Bridge: netw.Bridge{
			Name:   "ct" + id,
			Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 214, byte(b0(id)), 0}), 24),
		},
	}
	opts := container.Options{
		DataDir: e.DataDir, StagingDir: e.StagingDir, Bridge: e.Bridge,
		ShimCommand: []string{os.Args[0], "shim"},
		Logger:      slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, f := range mod {
		f(&opts)
	}
	m, err := container.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	e.Manager = m
	// Cleanups run last-in first-out: the leak check is registered first
	// so that it runs after the teardown.
	inst := m.Instance()
	t.Cleanup(func() { CheckNoLeaks(t, e.DataDir, inst) })
	t.Cleanup(func() { e.Teardown(t) })
	return e
}

func b0(id string) int {
	var b [1]byte
	_, _ = hex.Decode(b[:], []byte(id[:2]))
	return int(b[0])
}

// Teardown removes every container of the Env, its bridge and staging dir.
func (e *Env) Teardown(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := e.Manager.List(ctx)
	if err != nil {
		t.Errorf("teardown: list: %v", err)
	}
	for _, in := range list {
		if err := e.Manager.Remove(ctx, in.Name, true); err != nil {
			t.Errorf("teardown: remove %s: %v", in.Name, err)
		}
	}
	if err := e.Bridge.Delete(ctx); err != nil {
		t.Errorf("teardown: %v", err)
	}
	os.RemoveAll(e.StagingDir)
	if err := e.Manager.Unregister(); err != nil {
		t.Errorf("teardown: %v", err)
	}
}

// CheckNoLeaks fails t if anything made for the data dir dataDir or the
// Manager instance inst is still there: mounts, cgroups, network
// namespaces, veths, processes.
func CheckNoLeaks(t testing.TB, dataDir, inst string) {
	t.Helper()
	var leaks []string
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, dataDir) || strings.Contains(line, "cairn-"+inst) {
				leaks = append(leaks, "mount: "+line)
			}
		}
	}
	if ents, err := os.ReadDir(netw.NetnsDir); err == nil {
		for _, e := range ents {
			if strings.Contains(e.Name(), inst) {
				leaks = append(leaks, "netns: "+e.Name())
			}
		}
	}
	if ents, err := os.ReadDir("/sys/class/net"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "c"+inst) {
				leaks = append(leaks, "link: "+e.Name())
			}
		}
	}
	// cgroup v1 hierarchies and the unified one are all under /sys/fs/cgroup.
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/cairn-" + inst + "-*")
	for _, c := range cgroups {
		leaks = append(leaks, "cgroup: "+c)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if st, err := os.ReadFile(p + "/stat"); err == nil && strings.Contains(string(st), ") Z ") {
			continue // a zombie holds nothing but its pid
		}
		if cg, err := os.ReadFile(p + "/cgroup"); err == nil && strings.Contains(string(cg), "/cairn-"+inst+"-") {
			leaks = append(leaks, "process in container cgroup: "+p)
			continue
		}
		if cmd, err := os.ReadFile(p + "/cmdline"); err == nil && strings.Contains(string(cmd), dataDir) {
			leaks = append(leaks, "process working on the data dir: "+p+" "+strings.ReplaceAll(string(cmd), "\x00", " "))
			continue
		}
		if env, err := os.ReadFile(p + "/environ"); err == nil &&
			strings.Contains(string(env), container.ShimEnv+"=") && strings.Contains(string(env), dataDir) {
			leaks = append(leaks, "shim process: "+p)
		}
	}
	if container.Registered(dataDir) {
		leaks = append(leaks, "instance record in "+container.InstancesDir)
	}
	for _, l := range leaks {
		t.Errorf("leaked %s", l)
	}
}
