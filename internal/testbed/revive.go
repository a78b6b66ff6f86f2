package testbed

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cairn-hpc/cairn/internal/netw"
)

// ErrAgentRuns is Revive's answer for a node whose agent runs: the node
// has not failed, and there is nothing to bring back.
var ErrAgentRuns = errors.New("the node's agent runs")

// Revive brings a failed node back as a machine that is repaired and
// boots again does. What it held in memory is gone: its staging dir
// (tmpfs), what was mounted under its dirs, and its network namespace,
// made afresh with only its underlay address, without the job networks
// and rank namespaces it had. Its disk, the data dir, is as the failure
// left it (empty after Fail with loseData). Its agent starts again with
// the command line Up gave it (Node.Argv) and joins the cluster. Revive
// records the new process in cluster.json and returns once the
// coordinator has seen the node join again, with the node as now
// recorded. c itself is not changed, so that several nodes can be revived
// at once: Load the testbed again, or use the Node returned.
func (c *Cluster) Revive(ctx context.Context, name string) (Node, error) {
	var n Node
	since := time.Now()
	err := c.update(func(f *Cluster) error {
		i := -1
		for k := range f.Nodes {
			if f.Nodes[k].Name == name {
				i = k
			}
		}
		if i < 0 {
			return fmt.Errorf("no node %s in the local cluster", name)
		}
		n = f.Nodes[i]
		if Running(n.PID) {
			return fmt.Errorf("revive node %s: %w (pid %d); fail it first", name, ErrAgentRuns, n.PID)
		}
		if len(n.Argv) == 0 {
			return fmt.Errorf("revive node %s: cluster.json does not record its agent's command line (a cluster made by an older cairn): make the cluster again (cairn down, cairn up)", name)
		}
		if err := f.boot(ctx, n); err != nil {
			return fmt.Errorf("revive node %s: %w", name, err)
		}
		pid, err := Spawn(f.AgentLog(name), n.Argv, nil)
		if err != nil {
			return fmt.Errorf("revive node %s: %w", name, err)
		}
		f.Nodes[i].PID, n.PID = pid, pid
		return nil
	})
	if err != nil {
		return Node{}, err
	}
	return n, c.waitRejoined(ctx, n, since)
}

// boot clears what a node held in memory, as a machine's restart does:
// the mounts under its dirs, its staging dir (tmpfs), its rank
// namespaces, and its network namespace, made again as Up made it.
func (c *Cluster) boot(ctx context.Context, n Node) error {
	var errs []error
	for _, dir := range []string{n.Staging, n.Data} {
		errs = append(errs, unmountUnder(dir))
	}
	errs = append(errs, os.RemoveAll(n.Staging))
	underlay, err := netip.ParsePrefix(c.Underlay)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("underlay %q: %w", c.Underlay, err))...)
	}
	cl, err := netw.NewCluster(c.Prefix, underlay, len(c.Nodes))
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	node, ok := cl.Node(n.Name)
	if !ok {
		return errors.Join(append(errs, fmt.Errorf("node %s is not among the %d nodes of prefix %s", n.Name, len(c.Nodes), c.Prefix))...)
	}
	// Its ranks' namespaces are named after it ("NODE-j..."); no other
	// node's name starts with that.
	errs = append(errs, netw.Cleanup(ctx, n.Name+"-"), node.Delete(ctx))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return node.Create(ctx)
}

// update reads cluster.json again, lets fn change it and saves it, all
// under a lock on the testbed's dir, so that processes and goroutines
// that each record a process of their own do not undo each other's
// records.
func (c *Cluster) update(fn func(*Cluster) error) error {
	lf, err := os.OpenFile(filepath.Join(c.dir, "cluster.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lf.Name(), err)
	}
	f, err := Load(c.dir)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		return err
	}
	return f.Save()
}

// waitRejoined waits until the coordinator records that node n joined
// after since and counts it alive.
func (c *Cluster) waitRejoined(ctx context.Context, n Node, since time.Time) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	deadline := time.Now().Add(joinWithin)
	for {
		nodes, err := cl.Nodes(ctx)
		for _, nd := range nodes {
			if nd.Name == n.Name && nd.Alive && !nd.Joined.Before(since) {
				return nil
			}
		}
		if !Running(n.PID) {
			return fmt.Errorf("revive node %s: its agent (pid %d) exited; see %s", n.Name, n.PID, c.AgentLog(n.Name))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("revive node %s: not joined within %s (%v); see %s", n.Name, joinWithin, err, c.AgentLog(n.Name))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
