package netw

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
)

// UnderlayMTU is the MTU of the simulated physical network.
const UnderlayMTU = 1500

// Node is a simulated cluster node on one machine: a named network
// namespace whose eth0 is joined by a veth pair to a host bridge, the
// underlay ("physical network") that carries VXLAN between nodes.
//
// A node has no default route: it reaches only the other nodes on the
// underlay subnet (and the host, when the underlay bridge has an address),
// so nothing sent inside it can leave the machine.
type Node struct {
	Name     string     // netns name; also the name of the veth's host side, so at most 15 bytes
	Addr     netip.Addr // underlay address, on the node's eth0
	Underlay Bridge     // host bridge; only its Name and Subnet's length are used here
}

// Path is the node's netns bind mount.
func (n Node) Path() string { return NetnsPath(n.Name) }

// Command runs name in the node's network namespace only (see NetnsCommand).
func (n Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return NetnsCommand(ctx, n.Path(), name, args...)
}

// Create makes the node's netns and joins its eth0 to the underlay bridge,
// which must exist. On error it removes whatever it made.
func (n Node) Create(ctx context.Context) (err error) {
	if len(n.Name) > 15 {
		return fmt.Errorf("node name %q longer than 15 bytes", n.Name)
	}
	if NetnsExists(n.Name) {
		return fmt.Errorf("netns %s already exists", n.Name)
	}
	if err := ip(ctx, "netns", "add", n.Name); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = n.Delete(context.WithoutCancel(ctx))
		}
	}()
	mtu := fmt.Sprint(UnderlayMTU)
	return runAll(ctx, ip, [][]string{
		{"-n", n.Name, "link", "set", "lo", "up"},
		{"link", "add", n.Name, "mtu", mtu, "type", "veth", "peer", "name", "eth0", "mtu", mtu, "netns", n.Name},
		{"link", "set", n.Name, "master", n.Underlay.Name, "up"},
		{"-n", n.Name, "addr", "add", netip.PrefixFrom(n.Addr, n.Underlay.Subnet.Bits()).String(), "dev", "eth0"},
		{"-n", n.Name, "link", "set", "eth0", "up"},
	})
}

// Delete removes the node's netns, and with it every device inside: job
// bridges, vxlan devices and the node side of rank veths (which takes the
// ranks' eth0 along; rank namespaces themselves are separate and remain).
// Missing pieces are not errors.
func (n Node) Delete(ctx context.Context) error {
	var errs []error
	// The veth first: a deleted namespace's devices go asynchronously.
	if LinkExists(n.Name) {
		if err := ip(ctx, "link", "del", n.Name); err != nil && LinkExists(n.Name) {
			errs = append(errs, err)
		}
	}
	if NetnsExists(n.Name) {
		if err := ip(ctx, "netns", "del", n.Name); err != nil && NetnsExists(n.Name) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Cluster is a set of nodes on one underlay bridge: what `cairn up --nodes N`
// builds on one machine.
type Cluster struct {
	Underlay Bridge
	// HostAddr gives the underlay bridge its gateway address, so that
	// processes on the host reach the nodes. Without it the host's routing
	// is left untouched, and clusters with overlapping subnets coexist.
	HostAddr bool
	Nodes    []Node
}

// NewCluster names a cluster of n nodes: bridge prefix+"br", nodes
// prefix+"n1" .. prefix+"nN" at the underlay subnet's second, third, ...
// host addresses (the first is the bridge's gateway). It creates nothing.
func NewCluster(prefix string, subnet netip.Prefix, n int) (Cluster, error) {
	c := Cluster{Underlay: Bridge{Name: prefix + "br", Subnet: subnet.Masked()}}
	if !subnet.Addr().Is4() {
		return c, fmt.Errorf("underlay subnet %s is not IPv4", subnet)
	}
	a := c.Underlay.Gateway()
	for i := 1; i <= n; i++ {
		a = a.Next()
		if !subnet.Contains(a) || !subnet.Contains(a.Next()) {
			return c, fmt.Errorf("underlay subnet %s too small for %d nodes", subnet, n)
		}
		c.Nodes = append(c.Nodes, Node{Name: fmt.Sprintf("%sn%d", prefix, i), Addr: a, Underlay: c.Underlay})
	}
	return c, nil
}

// Node returns the node named name.
func (c Cluster) Node(name string) (Node, bool) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// Create makes the underlay bridge and every node. On error it removes
// whatever it made.
func (c Cluster) Create(ctx context.Context) (err error) {
	if len(c.Underlay.Name) > 15 {
		return fmt.Errorf("bridge name %q longer than 15 bytes", c.Underlay.Name)
	}
	defer func() {
		if err != nil {
			_ = c.Delete(context.WithoutCancel(ctx))
		}
	}()
	if c.HostAddr {
		if err := c.Underlay.Ensure(ctx); err != nil {
			return err
		}
	} else {
		if !LinkExists(c.Underlay.Name) {
			if err := ip(ctx, "link", "add", c.Underlay.Name, "type", "bridge"); err != nil {
				return err
			}
		}
		if err := ip(ctx, "link", "set", c.Underlay.Name, "up"); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		if err := n.Create(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Delete removes every node and the underlay bridge. Missing pieces are not
// errors. Rank namespaces are not the cluster's: delete job networks first.
func (c Cluster) Delete(ctx context.Context) error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Delete(ctx))
	}
	errs = append(errs, c.Underlay.Delete(ctx))
	return errors.Join(errs...)
}
