package testutil

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/testbed"
)

// Failures made on purpose: agents, the coordinator and whole nodes
// killed, and started again.

// agentCmdline returns the argv of a node's agent.
func agentCmdline(t testing.TB, pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// KillAgent SIGKILLs a node's agent (its containers go on) and returns
// what restarts it: the same command in the node's network namespace,
// with env added to its environment, waiting until the new agent has
// joined the cluster. The coordinator still counts the node alive for a
// while after the kill, so a count of live nodes cannot tell that.
func (c *Cluster) KillAgent(node string) (restart func(env ...string)) {
	c.t.Helper()
	return c.killAgent(node, nil)
}

// RestartAgentWith restarts a node's agent with args added to its
// command line, and waits until it has joined the cluster again.
func (c *Cluster) RestartAgentWith(node string, args ...string) {
	c.t.Helper()
	c.killAgent(node, args)()
}

func (c *Cluster) killAgent(node string, args []string) (restart func(env ...string)) {
	c.t.Helper()
	f := c.File()
	joined := func() int { return strings.Count(c.AgentLog(node), `msg="joined the cluster"`) }
	for i, n := range f.Nodes {
		if n.Name != node {
			continue
		}
		argv := append(agentCmdline(c.t, n.PID), args...)
		before := joined()
		if err := syscall.Kill(n.PID, syscall.SIGKILL); err != nil {
			c.t.Fatal(err)
		}
		waitGone(c.t, n.PID)
		return func(env ...string) {
			c.t.Helper()
			// The agent itself is already in the node's netns: join it.
			full := append([]string{"nsenter", "--net=" + netw.NetnsPath(node), "--"}, argv...)
			f := c.File()
			f.Nodes[i].PID = c.spawn(f.AgentLog(node), full, env)
			c.save(f)
			WaitUntil(c.t, 30*time.Second, func() (bool, string) {
				n := joined()
				return n > before, fmt.Sprintf("%s's agent joined %d times, %d before its restart", node, n, before)
			})
		}
	}
	c.t.Fatalf("no node %s", node)
	return nil
}

// RestartAgent restarts a node's agent with env added to its environment,
// and waits until it has joined the cluster again.
func (c *Cluster) RestartAgent(node string, env ...string) { c.KillAgent(node)(env...) }

// KillCoordinator SIGKILLs the (first) coordinator and returns what
// restarts it.
func (c *Cluster) KillCoordinator(env ...string) (restart func(env ...string)) {
	c.t.Helper()
	return c.KillCoordinatorNamed(c.File().Coordinators[0].Name)
}

// KillCoordinatorNamed SIGKILLs the coordinator named name and returns
// what restarts it, with env added to its environment.
func (c *Cluster) KillCoordinatorNamed(name string) (restart func(env ...string)) {
	c.t.Helper()
	co, i := c.coord(name)
	argv := agentCmdline(c.t, co.PID)
	if err := syscall.Kill(co.PID, syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
	// Until it is gone it holds its port and the etcd dir's lock.
	waitGone(c.t, co.PID)
	return func(env ...string) {
		c.t.Helper()
		f := c.File()
		f.Coordinators[i].PID = c.spawn(co.Log(), argv, env)
		c.save(f)
	}
}

// coord returns the coordinator named name and its index in cluster.json.
func (c *Cluster) coord(name string) (testbed.Coord, int) {
	c.t.Helper()
	for i, co := range c.File().Coordinators {
		if co.Name == name {
			return co, i
		}
	}
	c.t.Fatalf("no coordinator %s", name)
	return testbed.Coord{}, 0
}

// spawn starts a process of the cluster again.
func (c *Cluster) spawn(logPath string, argv, env []string) int {
	c.t.Helper()
	pid, err := testbed.Spawn(logPath, argv, env)
	if err != nil {
		c.t.Fatal(err)
	}
	return pid
}

// save records processes a test restarted in cluster.json, so that
// `cairn down` stops them.
func (c *Cluster) save(f *testbed.Cluster) {
	c.t.Helper()
	if err := f.Save(); err != nil {
		c.t.Fatal(err)
	}
}

// KillNode fails a node: its agent and every container on it are killed
// (SIGKILL), and with deleteData its data dir is deleted, as if the machine
// had died with its disk.
func (c *Cluster) KillNode(node string, deleteData bool) { c.KillNodes([]string{node}, deleteData) }

// KillNodes fails several nodes at once: every agent is SIGKILLed first,
// so none of them outlives another by the seconds the clean-up takes, then
// their containers are killed and, with deleteData, their data dirs
// deleted.
func (c *Cluster) KillNodes(nodes []string, deleteData bool) {
	c.t.Helper()
	f := c.File()
	var dead []testbed.Node
	for _, node := range nodes {
		n, ok := f.Node(node)
		if !ok {
			c.t.Fatalf("no node %s", node)
		}
		if err := syscall.Kill(n.PID, syscall.SIGKILL); err != nil {
			c.t.Fatal(err)
		}
		dead = append(dead, n)
	}
	for _, n := range dead {
		waitGone(c.t, n.PID)
		if err := n.Fail(context.Background(), testbed.Runtime{}, deleteData); err != nil {
			c.t.Fatalf("fail node %s: %v", n.Name, err)
		}
	}
}
