package failover

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/internal/testbed"
	"cairn/internal/testutil"
)

// TestStaleCoordinatorFenced: a second coordinator started on the same
// catalog takes a newer term; once it has checkpointed the job, the
// first one, which still runs and reaches every agent, is refused by the
// agents (stale_term) and changes nothing: the ranks run on, and the new
// coordinator's rounds go on. A restarted agent still refuses it (the
// term is kept in its data dir).
func TestStaleCoordinatorFenced(t *testing.T) {
	c := testutil.NewCluster(t, 2)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1"}, c.RingArgs(1_000_000_000)...)...)
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	c.OK("checkpoint", "ring")

	// The second coordinator: the same credentials and catalog (the
	// first one's etcd socket), a port of its own.
	dir := filepath.Join(testbed.Dir(c.Data), "coordinator")
	sock := filepath.Join(dir, "etcd", "etcd.sock")
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("the coordinator's etcd socket: %v", err)
	}
	f := c.File()
	host, _, _ := net.SplitHostPort(f.Coordinator)
	addr := net.JoinHostPort(host, "7499")
	second := t.TempDir()
	cmd := exec.Command(c.Bin, "--data", second, "coordinator", "--creds", filepath.Join(dir, "creds"), "--dir", second,
		"--listen", addr, "--etcd", "unix://"+sock)
	logf, err := os.Create(filepath.Join(second, "coordinator.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("second coordinator's log:\n%s", b)
		}
	})
	creds := filepath.Join(testbed.Dir(c.Data), "client")
	viaSecond := func(args ...string) (string, error) {
		out, err := exec.Command(c.Bin, append([]string{"--coordinator", addr, "--creds", creds}, args...)...).CombinedOutput()
		return string(out), err
	}
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		out, err := viaSecond("jobs")
		return err == nil, fmt.Sprintf("%v: %s", err, out)
	})
	if out, err := viaSecond("checkpoint", "ring"); err != nil {
		t.Fatalf("checkpoint through the new coordinator: %v\n%s", err, out)
	}

	// The first coordinator may no longer act.
	out, err := c.Run("checkpoint", "ring")
	if err == nil || !strings.Contains(out, "stale_term") && !strings.Contains(out, "newer coordinator") {
		t.Fatalf("checkpoint through the replaced coordinator: %v\n%s", err, out)
	}
	t.Logf("the replaced coordinator: %s", strings.TrimSpace(out))
	if out, err := c.Run("kill", "ring"); err == nil {
		t.Fatalf("the replaced coordinator killed the job: %s", out)
	}
	c.Moves("ring", 2, 60*time.Second)

	// An agent that restarts remembers the newest term.
	c.RestartAgent(c.Status("ring").Placement[0])
	if out, err := c.Run("kill", "ring"); err == nil {
		t.Fatalf("the replaced coordinator killed the job after an agent restart: %s", out)
	}
	if out, err := viaSecond("checkpoint", "ring"); err != nil {
		t.Fatalf("checkpoint through the new coordinator after the agent's restart: %v\n%s", err, out)
	}
	c.Moves("ring", 2, 60*time.Second)
}
