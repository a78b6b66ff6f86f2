package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/netw"

	"golang.org/x/sys/unix"
)

// Runtime are the binaries a node's containers are managed with: Down and
// Fail remove them.
type Runtime struct {
	CRIU, Runc string
}

func (n Node) manager(rt Runtime) (*container.Manager, error) {
	return container.New(container.Options{DataDir: n.Data, StagingDir: n.Staging, CRIU: rt.CRIU, Runc: rt.Runc})
}

// Containers lists the node's containers as its data dir holds them,
// reading only, without its agent (which may be cut off, or dead).
func (n Node) Containers(ctx context.Context, rt Runtime) ([]*container.Info, error) {
	m, err := n.manager(rt)
	if err != nil {
		return nil, err
	}
	return m.List(ctx)
}

// Down stops the agents, removes every container of every node, the
// namespaces and links named with the testbed's prefix, stops the
// coordinator and deletes the testbed's directory. When something cannot
// be removed, the directory is kept, for another try.
func (c *Cluster) Down(ctx context.Context, rt Runtime) error {
	var errs []error
	for _, n := range c.Nodes {
		stop(n.PID)
	}
	for _, n := range c.Nodes {
		if _, err := os.Stat(n.Data); err != nil {
			continue
		}
		if n.ClockOffset != 0 {
			// runc, run from here, would read the start times of the
			// node's containers off by the node's clock offset and take
			// them for stopped: they are killed as the machine's stop
			// would, and then removed.
			pids := n.processes()
			signal(pids, syscall.SIGKILL)
			errs = append(errs, waitKilled(n.Name, pids))
		}
		m, err := n.manager(rt)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		list, err := m.List(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for _, in := range list {
			if err := m.Remove(ctx, in.Name, true); err != nil {
				errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
			}
		}
		// The cgroups of a container a killed agent was making are in no
		// list.
		if err := removeCgroups(m.Instance()); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
		}
		// What a process killed half-way left mounted (CRIU's cgroup yard
		// of a restore, runc's CRIU root) would keep the dirs busy.
		for _, dir := range []string{n.Staging, n.Data} {
			if err := unmountUnder(dir); err != nil {
				errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
			}
		}
		_ = os.RemoveAll(n.Staging)
		if err := m.Unregister(); err != nil {
			errs = append(errs, err)
		}
	}
	// All at once: a coordinator that waits for the others' etcd to
	// answer would wait for nothing once they have gone.
	var wg sync.WaitGroup
	for _, co := range c.Coordinators {
		wg.Go(func() { stop(co.PID) })
	}
	wg.Wait()
	if err := netw.Cleanup(ctx, c.Prefix); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster down (state kept in %s): %w", c.dir, err)
	}
	return os.RemoveAll(c.dir)
}

// Fail makes a node fail as a machine that stops does: its agent, every
// container on it and whatever else ran on it (what its agent had
// started: runc, CRIU in the middle of a restore) are killed (SIGKILL),
// and what its memory held of them is gone: runc's state and the
// containers' cgroups, those of a container its agent was making
// included. With loseData its data dir and staging are deleted too, as if
// its disk had died with it. Its network namespace stays (Revive makes it
// again), so that calls to the node are refused rather than left
// unanswered.
func (n Node) Fail(ctx context.Context, rt Runtime, loseData bool) error {
	if err := kill(n.PID); err != nil {
		return err
	}
	pids := n.processes()
	signal(pids, syscall.SIGKILL)
	m, err := n.manager(rt)
	if err != nil {
		return err
	}
	list, err := m.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, in := range list {
		errs = append(errs, m.Remove(ctx, in.Name, true))
	}
	// A process frozen for a checkpoint dies only once thawed.
	errs = append(errs, waitKilled(n.Name, pids), os.RemoveAll(filepath.Join(n.Data, "runc")), removeCgroups(m.Instance()))
	if loseData {
		errs = append(errs, os.RemoveAll(n.Data), os.RemoveAll(n.Staging))
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	dir = filepath.Clean(dir)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var under []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		p := unescapeMount(f[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			under = append(under, p)
		}
	}
	sort.Slice(under, func(i, j int) bool { return len(under[i]) > len(under[j]) })
	var errs []error
	for _, p := range under {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
