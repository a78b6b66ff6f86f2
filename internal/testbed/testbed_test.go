package testbed_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/testbed"
)

// TestLoad: what Load reads is what cluster.json holds, and a testbed that
// does not exist is os.ErrNotExist.
func TestLoad(t *testing.T) {
	data := t.TempDir()
	dir := testbed.Dir(data)
	if _, err := testbed.Load(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no testbed: %v", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := `{
  "prefix": "cl-",
  "underlay": "10.212.0.0/24",
  "coordinator": "10.212.0.1:7400",
  "coordinators": [{"name": "c1", "addr": "10.212.0.1:7400", "dir": "/d/coordinator", "pid": 10}],
  "nodes": [
    {"name": "cl-n1", "addr": "10.212.0.2:7420", "data": "/d/n1", "staging": "/s/n1", "pid": 11},
    {"name": "cl-n2", "addr": "10.212.0.3:7420", "data": "/d/n2", "staging": "/s/n2", "pid": 12}
  ],
  "created": "2025-01-02T03:04:05Z"
}`
	if err := os.WriteFile(filepath.Join(dir, "cluster.json"), []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := testbed.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Dir() != dir || c.Prefix != "cl-" || c.Coordinator != "10.212.0.1:7400" || len(c.Nodes) != 2 || !c.Created.Equal(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Fatalf("loaded %+v", c)
	}
	if n, ok := c.Node("cl-n2"); !ok || n.Addr != "10.212.0.3:7420" || n.Data != "/d/n2" || n.Staging != "/s/n2" || n.PID != 12 {
		t.Errorf("node cl-n2: %+v %v", n, ok)
	}
	if _, ok := c.Node("cl-n3"); ok {
		t.Error("node cl-n3 found")
	}
	if got := c.PIDs(); len(got) != 3 || got[0] != 10 || got[1] != 11 || got[2] != 12 {
		t.Errorf("PIDs %v", got)
	}
	if c.ClientCreds() != filepath.Join(dir, "client") || c.AgentLog("cl-n1") != filepath.Join(dir, "nodes", "cl-n1", "agent.log") ||
		c.CoordinatorLog() != filepath.Join(dir, "coordinator", "coordinator.log") {
		t.Errorf("paths %s %s %s", c.ClientCreds(), c.AgentLog("cl-n1"), c.CoordinatorLog())
	}

	// Whoever restarts a process records it; the rest stays as it was.
	c.Nodes[1].PID, c.Coordinators[0].PID = 22, 20
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	again, err := testbed.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.Coordinators[0].PID != 20 || again.Nodes[1].PID != 22 || again.Nodes[0].PID != 11 || again.Underlay != "10.212.0.0/24" || !again.Created.Equal(c.Created) {
		t.Errorf("saved and loaded %+v", again)
	}
	// A record others could have written names processes to kill and a
	// command line to run: refused.
	path := filepath.Join(dir, "cluster.json")
	if err := os.Chmod(path, 0o622); err != nil {
		t.Fatal(err)
	}
	if _, err := testbed.Load(dir); err == nil || !strings.Contains(err.Error(), "no one else may write") {
		t.Errorf("a cluster.json others may write: %v", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 65534, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := testbed.Load(dir); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("a cluster.json of another user: %v", err)
	}
	if err := os.Chown(path, os.Geteuid(), -1); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := testbed.Load(dir); err == nil || !strings.Contains(err.Error(), "cluster.json") {
		t.Errorf("a damaged cluster.json: %v", err)
	}
}

// TestSpawn: a spawned process runs detached with its output and the
// environment it was given, and Running sees it end.
func TestSpawn(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	log := filepath.Join(t.TempDir(), "logs", "p.log")
	pid, err := testbed.Spawn(log, []string{sh, "-c", `echo "$GREETING"; exec sleep 60`}, []string{"GREETING=hello"})
	if err != nil {
		t.Fatal(err)
	}
	if !testbed.Running(pid) {
		t.Fatal("not running")
	}
	deadline := time.Now().Add(5 * time.Second)
	for b, _ := os.ReadFile(log); string(b) != "hello\n"; b, _ = os.ReadFile(log) {
		if time.Now().After(deadline) {
			t.Fatalf("log %q", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for testbed.Running(pid) {
		if time.Now().After(deadline) {
			t.Fatal("still running after SIGKILL")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if testbed.Running(0) || testbed.Running(-1) {
		t.Error("pid 0 or -1 runs")
	}
}

// TestUpRefuses: Up makes nothing of a config no testbed can be made of
// (too many nodes, a dashboard off the loopback), nor over a testbed that
// exists.
func TestUpRefuses(t *testing.T) {
	dir := testbed.Dir(t.TempDir())
	_, err := testbed.Up(t.Context(), testbed.Config{Dir: dir, Nodes: 300, Prefix: "x-", Underlay: netip.MustParsePrefix("10.9.9.0/28")})
	if !errors.Is(err, testbed.ErrBadConfig) {
		t.Errorf("300 nodes on a /28: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Up made %s: %v", dir, err)
	}
	for _, ui := range []string{"0.0.0.0:0", "10.9.9.1:7401", "localhost"} {
		_, err = testbed.Up(t.Context(), testbed.Config{Dir: dir, Nodes: 1, Prefix: "x-", Underlay: netip.MustParsePrefix("10.9.9.0/24"), UIListen: ui})
		if !errors.Is(err, testbed.ErrBadConfig) {
			t.Errorf("dashboard on %s: %v", ui, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Up made %s: %v", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cluster.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = testbed.Up(t.Context(), testbed.Config{Dir: dir, Nodes: 1, Prefix: "x-", Underlay: netip.MustParsePrefix("10.9.9.0/24")})
	if err == nil || !strings.Contains(err.Error(), "a local cluster exists") {
		t.Errorf("over a testbed: %v", err)
	}
}

// TestReviveRefuses: Revive starts nothing for a node whose agent runs,
// one whose agent's command line was never recorded, or no node at all,
// and leaves cluster.json as it was.
func TestReviveRefuses(t *testing.T) {
	dir := testbed.Dir(t.TempDir())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := fmt.Sprintf(`{"prefix": "x-", "underlay": "10.9.9.0/24", "coordinator": "10.9.9.1:7400",
  "nodes": [
    {"name": "x-n1", "addr": "10.9.9.2:7420", "data": "/nonexistent/d1", "staging": "/nonexistent/s1", "pid": %d, "argv": ["/bin/false"]},
    {"name": "x-n2", "addr": "10.9.9.3:7420", "data": "/nonexistent/d2", "staging": "/nonexistent/s2", "pid": 0}
  ]}`, os.Getpid())
	if err := os.WriteFile(filepath.Join(dir, "cluster.json"), []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := testbed.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Revive(t.Context(), "x-n1"); !errors.Is(err, testbed.ErrAgentRuns) {
		t.Errorf("a node whose agent runs: %v", err)
	}
	if _, err := c.Revive(t.Context(), "x-n2"); err == nil || !strings.Contains(err.Error(), "command line") {
		t.Errorf("a node without its agent's command line: %v", err)
	}
	if _, err := c.Revive(t.Context(), "x-n3"); err == nil || !strings.Contains(err.Error(), "no node x-n3") {
		t.Errorf("no such node: %v", err)
	}
	again, err := testbed.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.Nodes[0].PID != os.Getpid() || again.Nodes[1].PID != 0 || len(again.Nodes[0].Argv) != 1 {
		t.Errorf("cluster.json changed: %+v", again.Nodes)
	}
}
