package container_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestOwnSessionKeyring: every container has a session keyring of its own,
// before and after a checkpoint and restore: keys the host's root (or
// another container) keeps in its session keyring are not the
// container's.
func TestOwnSessionKeyring(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	host, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, true)
	if err != nil {
		t.Fatal(err)
	}
	// keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0), by perl,
	// which every Debian has, printed by the container's own process every
	// 50 ms: a restored process is not started anew, and an exec'd one
	// would show what runc exec joins, not what the container holds.
	script := fmt.Sprintf(`$|=1; while (1) { print syscall(%d, %d, %d, 0), "\n"; select(undef, undef, undef, 0.05) }`,
		unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING)
	session := func(name string) string {
		t.Helper()
		var last string
		testutil.WaitUntil(t, 10*time.Second, func() (bool, string) {
			in, err := m.Get(ctx, name)
			if err != nil {
				return false, err.Error()
			}
			b, _ := os.ReadFile(in.Log)
			lines := strings.Fields(string(b))
			if len(lines) == 0 {
				return false, name + " printed nothing"
			}
			last = lines[len(lines)-1]
			return true, ""
		})
		return last
	}
	for _, name := range []string{"k1", "k2"} {
		if _, err := m.Run(ctx, container.Config{Name: name, Args: []string{"perl", "-e", script}}); err != nil {
			t.Fatal(err)
		}
	}
	k1, k2 := session("k1"), session("k2")
	if k1 == fmt.Sprint(host) || k2 == fmt.Sprint(host) || k1 == k2 || k1 == "-1" || k2 == "-1" {
		t.Fatalf("session keyrings: host %d, k1 %s, k2 %s; want three of their own", host, k1, k2)
	}
	if _, err := m.Checkpoint(ctx, "k1", container.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	killAndRestore(t, m, "k1")
	if k := session("k1"); k == fmt.Sprint(host) || k == k2 || k == "-1" {
		t.Errorf("restored k1's session keyring %s: host %d, k2 %s; want its own", k, host, k2)
	}
}

// TestSecretEnvNotRecorded: the variables SecretEnv names reach the
// container, and stay out of the config its images record; a restore
// from such an image runs on with them, in its memory.
func TestSecretEnvNotRecorded(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	const secret = "5ecret5ecret5ecret"
	_, err := m.Run(ctx, container.Config{Name: "s", Env: []string{"PLAIN=visible", "LAUNCH_KEY=" + secret},
		SecretEnv: []string{"LAUNCH_KEY"},
		Args:      []string{"sh", "-c", `while :; do echo "key=$LAUNCH_KEY"; sleep 0.05; done`}})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := m.Checkpoint(ctx, "s", container.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg := string(rec.Config); strings.Contains(cfg, secret) || !strings.Contains(cfg, "PLAIN=visible") {
		t.Fatalf("recorded config %s: want PLAIN and not the secret", cfg)
	}
	killAndRestore(t, m, "s")
	testutil.WaitUntil(t, 10*time.Second, func() (bool, string) {
		in, err := m.Get(ctx, "s")
		if err != nil {
			return false, err.Error()
		}
		b, _ := os.ReadFile(in.Log)
		return strings.Contains(string(b), "key="+secret), fmt.Sprintf("restored container printed %q", b)
	})
}

// killAndRestore kills a checkpointed container and restores it from its
// newest image.
func killAndRestore(t *testing.T, m *container.Manager, name string) {
	t.Helper()
	ctx := context.Background()
	if err := m.Kill(ctx, name, 9); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Wait(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Restore(ctx, name, container.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
}
