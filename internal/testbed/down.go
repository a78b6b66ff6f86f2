package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"cairn/internal/container"
	"cairn/internal/netw"
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

// Fail makes a node fail as a machine that stops does: its agent and
// every container on it are killed (SIGKILL); with loseData its data dir
// and staging are deleted too, as if its disk had died with it.
func (n Node) Fail(ctx context.Context, rt Runtime, loseData bool) error {
	if err := kill(n.PID); err != nil {
		return err
	}
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
	if loseData {
		errs = append(errs, os.RemoveAll(n.Data), os.RemoveAll(n.Staging))
	}
	return errors.Join(errs...)
}
