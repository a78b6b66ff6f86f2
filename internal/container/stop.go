package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Kill sends sig to the container's init (SIGKILL ends the container).
func (m *Manager) Kill(ctx context.Context, name string, sig syscall.Signal) error {
	in, err := m.Get(ctx, name)
	if err != nil {
		return err
	}
	if !in.Status.Live() {
		return fmt.Errorf("%w: %s is %s", ErrNotRunning, name, in.Status)
	}
	if err := m.runc.run(ctx, "", "kill", m.runcID(name), fmt.Sprint(int(sig))); err != nil {
		return err
	}
	if sig == syscall.SIGKILL {
		m.waitShim(&in.State, 10*time.Second)
	}
	return nil
}

// Remove deletes a container. A running one is refused unless force, which
// kills it first. Its checkpoints are kept.
func (m *Manager) Remove(ctx context.Context, name string, force bool) error {
	unlock, err := m.lock(name)
	if err != nil {
		return err
	}
	defer unlock()
	in, err := m.Get(ctx, name)
	if err != nil {
		return err
	}
	if in.Status.Live() && !force {
		return fmt.Errorf("%w: %s (use --force to kill and remove it)", ErrRunning, name)
	}
	if err := m.destroy(ctx, &in.State); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return m.dropKept(name)
}

// Stop ends a container's processes and takes its runtime down (runc's
// state, its root mount, its network) but keeps its dir: its state, its
// logs and incarnations, for Restore to replace it with a new incarnation
// (a rank restored where it died).
func (m *Manager) Stop(ctx context.Context, name string) error {
	unlock, err := m.lock(name)
	if err != nil {
		return err
	}
	defer unlock()
	in, err := m.Get(ctx, name)
	if err != nil {
		return err
	}
	if err := m.teardown(ctx, &in.State); err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	return nil
}

// teardown stops whatever runs of st and removes its runtime pieces (runc
// state, overlay mount, network), keeping its directory and files.
func (m *Manager) teardown(ctx context.Context, st *State) error {
	var errs []error
	name := st.Config.Name
	m.killOrphans(name)
	if rs, err := m.runc.state(ctx, m.runcID(name)); err == nil {
		if rs.Status != StatusStopped {
			_ = m.runc.run(ctx, "", "kill", m.runcID(name), "KILL")
		}
		m.waitShim(st, 10*time.Second)
		if err := m.runc.run(ctx, "", "delete", "-f", m.runcID(name)); err != nil {
			errs = append(errs, err)
		}
	}
	m.waitShim(st, 5*time.Second)
	rootfs := m.rootPath(st)
	if err := unix.Unmount(rootfs, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		if err := unix.Unmount(rootfs, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", rootfs, err))
		}
	}
	if st.Config.UserNS {
		_ = os.Remove(rootfs) // the empty mount point
	}
	if st.Endpoint.Netns != "" {
		if err := st.Endpoint.Delete(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// destroy tears st down and removes every trace of it but its checkpoints.
func (m *Manager) destroy(ctx context.Context, st *State) error {
	err := m.teardown(ctx, st)
	if rerr := m.ipam.Release(st.Config.Name); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return err
	}
	return removeDir(m.dir(st.Config.Name))
}
