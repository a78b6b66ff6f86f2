package container_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// execOut runs a shell script in a running container and returns its
// standard output.
func execOut(t *testing.T, m *container.Manager, name, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if _, err := m.Exec(context.Background(), name, []string{"sh", "-c", script}, nil, &out, &errb); err != nil {
		t.Fatalf("exec in %s: %v (%s)", name, err, errb.String())
	}
	return out.String()
}

// TestContainerSeesNothingOfCairn reads, from inside a container, what a
// rank must not see: the data dir (other containers' upper dirs, the
// store), the staging dir, a hidden credentials dir standing for a
// cluster's keys, /run/netns, the host's password hashes and cairn's
// default data dir (there on any machine where cairn has been used). Each
// must be absent or an empty dir, while the rest of the root works as
// before.
func TestContainerSeesNothingOfCairn(t *testing.T) {
	keys, err := os.MkdirTemp("/var/tmp", "cairn-test-keys-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(keys) })
	if err := os.WriteFile(filepath.Join(keys, "ca.key"), []byte("SECRET-KEY\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// On a machine where cairn has been used, its default data dir is
	// there, full: make one for the test where there is none.
	if _, err := os.Stat(container.DefaultDataDir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Join(container.DefaultDataDir, "containers"), 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(container.DefaultDataDir) })
		if err := os.WriteFile(filepath.Join(container.DefaultDataDir, "instance"), []byte("test\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := testutil.NewEnv(t, func(o *container.Options) { o.Hide = append(o.Hide, keys) })
	ctx := context.Background()
	m := env.Manager
	if err := os.WriteFile(filepath.Join(env.DataDir, "marker"), []byte("data\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Run(ctx, container.Config{Name: "other", Args: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Run(ctx, container.Config{Name: "spy", Args: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(env.StagingDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(env.StagingDir, "marker"), []byte("staging\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	probes := []string{
		filepath.Join(env.DataDir, "marker"),
		filepath.Join(env.DataDir, "containers"),
		filepath.Join(env.StagingDir, "marker"),
		filepath.Join(keys, "ca.key"),
		"/run/netns",
		"/etc/shadow",
		"/var/lib/cairn",
	}
	// A hidden dir shows as an empty one (mask.go): what is seen is a
	// file, or a dir with anything in it.
	var script strings.Builder
	for _, p := range probes {
		fmt.Fprintf(&script, "if [ -e %q ] && { [ ! -d %q ] || [ -n \"$(ls -A %q)\" ]; }; then echo \"SEEN %s\"; fi\n", p, p, p, p)
	}
	script.WriteString("ls -A " + env.DataDir + " 2>/dev/null | sed 's/^/LISTED /'\n")
	script.WriteString("cat " + filepath.Join(keys, "ca.key") + " 2>/dev/null\n")
	out := execOut(t, m, "spy", script.String())
	if strings.TrimSpace(out) != "" {
		t.Errorf("the container sees what it must not:\n%s", out)
	}
	// The rest of the root is as the host has it: programs run, the
	// sticky world-writable dirs keep their mode, and hidden dirs are
	// writable places of the container's own.
	got := execOut(t, m, "spy", "stat -c %a /var/tmp /tmp; test -d /root && echo hi > /root/f && cat /root/f; ls /usr/bin/sh")
	if want := "1777\n1777\nhi\n/usr/bin/sh\n"; got != want {
		t.Errorf("root after hiding: got %q, want %q", got, want)
	}
	// What the container wrote there is its own, not the host's.
	if _, err := os.Stat("/root/f"); err == nil && !strings.HasPrefix(env.DataDir, "/root") {
		b, _ := os.ReadFile("/root/f")
		if string(b) == "hi\n" {
			t.Error("the container's /root/f landed in the host's /root")
		}
	}
}

// TestHiddenStaysHidden checkpoints and restores a container: the restored
// one sees no more than the original did, and what it wrote in a hidden
// dir came back with it.
func TestHiddenStaysHidden(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	if _, err := m.Run(ctx, container.Config{Name: "c", Args: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	execOut(t, m, "c", "echo mine > /root/note")
	if _, err := m.Checkpoint(ctx, "c", container.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Restore(ctx, "c", container.RestoreOptions{Seq: 1, As: "c2"}); err != nil {
		t.Fatal(err)
	}
	got := execOut(t, m, "c2", "cat /root/note; (ls -A "+env.DataDir+"; ls -A /run) | wc -l; test -e /etc/shadow && echo SHADOW; true")
	if got != "mine\n0\n" {
		t.Errorf("restored container: got %q, want %q", got, "mine\n0\n")
	}
}

// TestContainerCannotReachHost listens on the host, on the bridge's
// gateway and on every address, and tries to connect from a container: the
// bridge's guard refuses it, and lets it through once the port is allowed.
// Connections from the host into the container still work (the state app's
// tests use them), and so does traffic between containers.
func TestContainerCannotReachHost(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "hello")
			c.Close()
		}
	}()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	peer, err := m.Run(ctx, container.Config{Name: "peer", Args: []string{"sh", "-c", "while true; do sleep 1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Run(ctx, container.Config{Name: "c", Args: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	targets := []netip.Addr{env.Bridge.Gateway()}
	if a := hostAddr(t, env.Bridge.Name); a.IsValid() {
		targets = append(targets, a)
	}
	// within: a refused port waits for it all (a dropped SYN is no
	// answer); an allowed one answers at once, but a loaded machine may
	// take seconds to start bash.
	connect := func(a netip.Addr, within int) string {
		return strings.TrimSpace(execOut(t, m, "c", fmt.Sprintf(
			"timeout %d bash -c 'exec 3<>/dev/tcp/%s/%d && head -1 <&3' 2>/dev/null || echo refused", within, a, port)))
	}
	for _, a := range targets {
		if got := connect(a, 3); got != "refused" {
			t.Errorf("container connected to the host at %s:%d: %q", a, port, got)
		}
	}
	if ok, err := netw.Guarded(ctx, "", env.Bridge.Name); err != nil || !ok {
		t.Fatalf("Guarded = %v, %v", ok, err)
	}
	if err := netw.Guard(ctx, "", env.Bridge.Name, []uint16{port}); err != nil {
		t.Fatal(err)
	}
	for _, a := range targets {
		if got := connect(a, 20); got != "hello" {
			t.Errorf("allowed port %d at %s: got %q", port, a, got)
		}
	}
	// Containers still reach each other (ICMP aside, any TCP port: the
	// peer listens nowhere, so a refusal is an answer and not a timeout).
	start := time.Now()
	out := execOut(t, m, "c", fmt.Sprintf("timeout 3 bash -c 'exec 3<>/dev/tcp/%s/9' 2>&1; echo rc=$?", peer.Addr))
	if !strings.Contains(out, "refused") || time.Since(start) > 3*time.Second {
		t.Errorf("container to container: %q after %v, want a quick 'Connection refused'", out, time.Since(start))
	}
}

// hostAddr is an IPv4 address of the host outside the bridge, if any.
func hostAddr(t *testing.T, bridge string) netip.Addr {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifs {
		if ifc.Name == bridge || ifc.Flags&net.FlagLoopback != 0 || ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
				return p.Addr()
			}
		}
	}
	return netip.Addr{}
}

// TestUserNS runs a container in a user namespace of its own: its root is
// uid 0 inside and host uid UserNSBase outside, so a host file only host
// root may read (one cairn does not hide) stays unreadable, while the
// container runs and writes where the host lets everybody write. Its
// checkpoint is refused up front with ErrUserNSCheckpoint and it runs on.
func TestUserNS(t *testing.T) {
	secret, err := os.CreateTemp("/var/tmp", "cairn-test-secret-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(secret.Name()) })
	secret.WriteString("ROOT-ONLY\n")
	secret.Close()
	if err := os.Chmod(secret.Name(), 0o600); err != nil {
		t.Fatal(err)
	}
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	for _, userns := range []bool{false, true} {
		name := fmt.Sprintf("u%v", userns)
		script := "id -u; cat /proc/self/uid_map | tr -s ' '; cat " + secret.Name() + " 2>&1; echo w > /tmp/w && echo WROTE; echo DONE; exec sleep 600"
		in, err := m.Run(ctx, container.Config{Name: name, UserNS: userns, Args: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatal(err)
		}
		var out string
		testutil.WaitUntil(t, 10*time.Second, func() (bool, string) {
			b, _ := os.ReadFile(in.Log)
			out = string(b)
			return strings.Contains(out, "DONE"), out
		})
		readable := strings.Contains(out, "ROOT-ONLY")
		mapped := strings.Contains(out, fmt.Sprintf(" 0 %d %d", container.UserNSBase, container.UserNSSize))
		if !strings.HasPrefix(out, "0\n") || !strings.Contains(out, "WROTE") || readable == userns || mapped != userns {
			t.Errorf("userns=%v: container saw:\n%s", userns, out)
		}
	}
	_, err = m.Checkpoint(ctx, "utrue", container.CheckpointOptions{})
	if !errors.Is(err, container.ErrUserNSCheckpoint) {
		t.Fatalf("checkpoint of a --userns container: %v, want ErrUserNSCheckpoint", err)
	}
	if _, err := m.Exec(ctx, "utrue", []string{"true"}, nil, nil, nil); !errors.Is(err, container.ErrUserNSExec) {
		t.Fatalf("exec in a --userns container: %v, want ErrUserNSExec", err)
	}
	if in, _ := m.Get(ctx, "utrue"); in.Status != container.StatusRunning {
		t.Fatalf("after the refused checkpoint: %s", in.Status)
	}
}

// TestContainerSeesNothingOfOtherInstances: two cairn instances on one
// host (another data dir: a local cluster's node, say, with its
// credentials hidden): a container of one sees nothing of the other's
// data dir, staging dir or hidden dirs.
func TestContainerSeesNothingOfOtherInstances(t *testing.T) {
	keys, err := os.MkdirTemp("/var/tmp", "cairn-test-keys-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(keys) })
	if err := os.WriteFile(filepath.Join(keys, "ca.key"), []byte("SECRET-KEY\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := testutil.NewEnv(t, func(o *container.Options) { o.Hide = append(o.Hide, keys) })
	if err := os.WriteFile(filepath.Join(other.DataDir, "marker"), []byte("data\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(other.StagingDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other.StagingDir, "marker"), []byte("staging\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := testutil.NewEnv(t)
	if _, err := env.Manager.Run(context.Background(), container.Config{Name: "spy", Args: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	for _, p := range []string{filepath.Join(other.DataDir, "marker"), filepath.Join(other.StagingDir, "marker"), filepath.Join(keys, "ca.key")} {
		fmt.Fprintf(&script, "if [ -e %q ]; then echo \"SEEN %s\"; fi\n", p, p)
	}
	if out := execOut(t, env.Manager, "spy", script.String()); strings.TrimSpace(out) != "" {
		t.Errorf("a container sees another instance's dirs:\n%s", out)
	}
}
