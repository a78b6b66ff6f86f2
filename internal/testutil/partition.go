package testutil

import (
	"context"
	"os/exec"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testbed"
)

// Partition cuts node off the underlay, as a failed link or switch port
// would: the host side of its veth goes down, so that neither the
// coordinators nor the other nodes reach it, while its agent and its
// ranks go on running. heal brings the link back; the test's cleanup
// heals if the test has not.
func (c *Cluster) Partition(node string) (heal func()) {
	c.t.Helper()
	if _, ok := c.File().Node(node); !ok {
		c.t.Fatalf("no node %s", node)
	}
	link := func(state string) error {
		out, err := exec.Command("ip", "link", "set", node, state).CombinedOutput()
		if err != nil {
			c.t.Logf("ip link set %s %s: %v: %s", node, state, err, out)
		}
		return err
	}
	if link("down") != nil {
		c.t.Fatalf("cannot cut node %s off", node)
	}
	healed := false
	heal = func() {
		if !healed && link("up") == nil {
			healed = true
		}
	}
	c.t.Cleanup(heal)
	return heal
}

// NodeContainers reads the status of every container of node from its
// data dir, without its agent (which may be cut off).
func (c *Cluster) NodeContainers(node string) map[string]container.Status {
	c.t.Helper()
	n, ok := c.File().Node(node)
	if !ok {
		c.t.Fatalf("no node %s", node)
	}
	ins, err := n.Containers(context.Background(), testbed.Runtime{})
	if err != nil {
		c.t.Fatalf("containers of %s: %v", node, err)
	}
	out := map[string]container.Status{}
	for _, in := range ins {
		out[in.Name] = in.Status
	}
	return out
}
