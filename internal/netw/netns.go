package netw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// NetnsPath is the bind mount of the named network namespace name.
func NetnsPath(name string) string { return filepath.Join(NetnsDir, name) }

// NetnsExists reports whether the named network namespace exists.
func NetnsExists(name string) bool {
	_, err := os.Stat(NetnsPath(name))
	return err == nil
}

// NetnsCommand returns a command that runs name with args in the network
// namespace at path and in no other new namespace: it uses `nsenter --net`,
// not `ip netns exec`, which also unshares a mount namespace (CRIU refuses
// to dump or restore across one).
func NetnsCommand(ctx context.Context, path, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + path, "--", name}, args...)...)
}

// InNetns runs fn on a fresh OS thread that has joined the network namespace
// at path, and waits for it. Sockets fn creates belong to that namespace for
// their whole life, so they may be used from any goroutine afterwards. The
// thread is discarded when fn returns; the caller's thread is never switched.
// fn must not start goroutines that expect to run in the namespace.
func InNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends a locked thread whose goroutine
		// exits, so the switched thread is never reused.
		runtime.LockOSThread()
		f, err := os.Open(path)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// bridgeCmd runs iproute2's `bridge args...` like ip does.
func bridgeCmd(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "bridge", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("bridge %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// runAll runs steps in order with run and stops at the first error.
func runAll(ctx context.Context, run func(context.Context, ...string) error, steps [][]string) error {
	for _, s := range steps {
		if err := run(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// Cleanup removes every named network namespace, and every bridge, veth
// and vxlan link in the current namespace, whose name starts with prefix.
// Deleting a node's namespace removes the devices inside it. It is meant for
// `cairn down` and tests, after a crash left state behind; prefix must be
// at least 3 bytes so that it cannot match a host's own interfaces by
// accident, and only those link types are ever touched.
func Cleanup(ctx context.Context, prefix string) error {
	if len(prefix) < 3 {
		return fmt.Errorf("cleanup prefix %q shorter than 3 bytes", prefix)
	}
	var errs []error
	ents, err := os.ReadDir(NetnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			if err := ip(ctx, "netns", "del", e.Name()); err != nil && NetnsExists(e.Name()) {
				errs = append(errs, err)
			}
		}
	}
	for _, typ := range []string{"veth", "vxlan", "bridge"} {
		names, err := linkNames(ctx, "", typ)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, n := range names {
			if strings.HasPrefix(n, prefix) && LinkExists(n) {
				if err := ip(ctx, "link", "del", n); err != nil && LinkExists(n) {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// linkNames lists the links of type typ (all when "") in the named netns
// (the current one when "").
func linkNames(ctx context.Context, netns, typ string) ([]string, error) {
	args := []string{"-o", "link", "show"}
	if netns != "" {
		args = append([]string{"-n", netns}, args...)
	}
	if typ != "" {
		args = append(args, "type", typ)
	}
	out, err := exec.CommandContext(ctx, "ip", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("ip %s: %w", strings.Join(args, " "), err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		// "7: name@peer: <FLAGS> ..."
		f := strings.SplitN(line, ": ", 3)
		if len(f) < 3 {
			continue
		}
		name, _, _ := strings.Cut(f[1], "@")
		names = append(names, name)
	}
	return names, nil
}

// deleteNetns deletes the named netns; a missing one is not an error.
func deleteNetns(ctx context.Context, name string) error {
	if !NetnsExists(name) {
		return nil
	}
	if err := ip(ctx, "netns", "del", name); err != nil && NetnsExists(name) {
		return err
	}
	return nil
}
