package netw

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// agent drives a NodeJobNet as a node's agent does. With in set, every call
// runs on a thread inside the node's netns at that path, and the NodeJobNet
// has Netns "": what an agent started with nsenter --net sees.
type agent struct {
	n  NodeJobNet
	in string
}

func (g agent) do(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if g.in == "" {
		return fn(ctx)
	}
	return InNetns(g.in, func() error { return fn(ctx) })
}

func (g agent) ensure(t *testing.T) {
	t.Helper()
	if err := g.do(g.n.Ensure); err != nil {
		t.Fatal(err)
	}
}

func (g agent) attach(t *testing.T, addr string, locked bool) Rank {
	t.Helper()
	var r Rank
	err := g.do(func(ctx context.Context) (err error) {
		r, err = g.n.AttachRank(ctx, netip.MustParseAddr(addr), locked)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (g agent) detach(t *testing.T, a netip.Addr) {
	t.Helper()
	if err := g.do(func(ctx context.Context) error { return g.n.DetachRank(ctx, a) }); err != nil {
		t.Fatal(err)
	}
}

func (g agent) setRemotes(remotes map[netip.Addr]netip.Addr) error {
	return g.do(func(ctx context.Context) error { return g.n.SetRemotes(ctx, remotes) })
}

// view is g's NodeJobNet addressed by netns name, to inspect the node from
// the test's own namespace.
func (g agent) view(node Node) NodeJobNet {
	n := g.n
	n.Netns = node.Name
	return n
}

// testAgents makes one agent per node of c for job vni: all but the last
// by netns name, the last from inside its node. Each agent's devices and
// ranks are deleted when the test ends.
func testAgents(t *testing.T, c Cluster, prefix string, vni uint32, subnet string) []agent {
	t.Helper()
	var gs []agent
	for i, node := range c.Nodes {
		g := agent{n: NodeJobNet{
			Netns: node.Name, Local: node.Addr, VNI: vni,
			Subnet: netip.MustParsePrefix(subnet), Prefix: fmt.Sprintf("%sn%d-", prefix, i+1),
		}}
		if i == len(c.Nodes)-1 {
			g.n.Netns, g.in = "", node.Path()
		}
		t.Cleanup(func() {
			if err := g.do(g.n.Delete); err != nil {
				t.Errorf("delete job %d on %s: %v", vni, node.Name, err)
			}
		})
		gs = append(gs, g)
	}
	return gs
}

// placement maps rank addresses to the index of their node.
type placement map[netip.Addr]int

// setRemotes tells every agent where the ranks that are not its own run.
func (p placement) setRemotes(t *testing.T, c Cluster, gs []agent) {
	t.Helper()
	for i, g := range gs {
		remotes := map[netip.Addr]netip.Addr{}
		for a, on := range p {
			if on != i {
				remotes[a] = c.Nodes[on].Addr
			}
		}
		if err := g.setRemotes(remotes); err != nil {
			t.Fatalf("SetRemotes on %s: %v", c.Nodes[i].Name, err)
		}
	}
}

// remotesOf reads node's forwarding entries of g's job, over netlink as
// cairn does, and checks that iproute2 shows the same.
func remotesOf(t *testing.T, g agent, node Node) remoteEntries {
	t.Helper()
	n := g.view(node)
	e, err := n.remotes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tools, err := remotesFromTools(n)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(tools, e, cmp.AllowUnexported(remoteEntries{}), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Fatalf("forwarding entries of %s over netlink differ from bridge fdb show and ip neigh show (-tools +netlink):\n%s", node.Name, d)
	}
	return e
}

// remotesFromTools reads the node's forwarding entries of the job's rank
// MACs as iproute2 shows them (bridge fdb show, ip neigh show).
func remotesFromTools(n NodeJobNet) (remoteEntries, error) {
	e := remoteEntries{neigh: map[netip.Addr]string{}, dst: map[netip.Addr]netip.Addr{}, static: map[netip.Addr]string{}}
	output := func(tool string, args ...string) ([]byte, error) {
		args = netnsArgs(n.Netns, args)
		out, err := exec.Command(tool, args...).Output()
		if err != nil {
			return nil, fmt.Errorf("%s %s: %v", tool, strings.Join(args, " "), err)
		}
		return out, nil
	}
	unmarshal := func(out []byte, v any) error {
		if len(bytes.TrimSpace(out)) == 0 {
			return nil // nothing may print as nothing at all rather than []
		}
		return json.Unmarshal(out, v)
	}
	vx := n.VXLANName()
	// By bridge rather than by device, to see the entries of local ranks
	// on their veths too.
	out, err := output("bridge", "-j", "fdb", "show", "br", n.BridgeName())
	if err != nil {
		return e, err
	}
	var fdb []struct {
		MAC    string `json:"mac"`
		Ifname string `json:"ifname"`
		Dst    string `json:"dst"`
		Master string `json:"master"`
		State  string `json:"state"`
	}
	if err := unmarshal(out, &fdb); err != nil {
		return e, err
	}
	for _, f := range fdb {
		a, ok := rankAddr(f.MAC)
		if !ok || !n.Subnet.Contains(a) {
			continue
		}
		switch {
		case f.Ifname == vx && f.Dst != "":
			if d, err := netip.ParseAddr(f.Dst); err == nil {
				e.dst[a] = d
			}
		case f.Master != "" && f.State == "static":
			e.static[a] = f.Ifname
		}
	}
	if out, err = output("ip", "-j", "neigh", "show", "dev", vx); err != nil {
		return e, err
	}
	var neigh []struct {
		Dst    string   `json:"dst"`
		LLAddr string   `json:"lladdr"`
		State  []string `json:"state"`
	}
	if err := unmarshal(out, &neigh); err != nil {
		return e, err
	}
	for _, ne := range neigh {
		a, err := netip.ParseAddr(ne.Dst)
		if err != nil || !n.Subnet.Contains(a) {
			continue
		}
		if slices.Contains(ne.State, "PERMANENT") {
			e.neigh[a] = ne.LLAddr
		} else {
			e.neigh[a] = ""
		}
	}
	return e, nil
}

func TestNodeJobNet(t *testing.T) {
	needRoot(t)
	c, prefix := testCluster(t, 3)
	const vni = 300
	gs := testAgents(t, c, prefix, vni, "10.217.0.0/24")
	for _, g := range gs {
		g.ensure(t)
		g.ensure(t) // idempotent
	}
	n3 := c.Nodes[2]
	ctx := context.Background()

	// The agent inside node 3 made its devices there, not on the host.
	br, vx := gs[2].n.BridgeName(), gs[2].n.VXLANName()
	for _, l := range []string{br, vx} {
		if !linkExistsIn(ctx, n3.Name, l) || LinkExists(l) {
			t.Fatalf("%s: in %s %v, on the host %v; want only in the node",
				l, n3.Name, linkExistsIn(ctx, n3.Name, l), LinkExists(l))
		}
	}
	// Its job bridge is guarded there: ranks reach no listener of the node.
	inNode, err1 := Guarded(ctx, netnsPathOf(n3.Name), br)
	onHost, err2 := Guarded(ctx, "", br)
	if !inNode || onHost || err1 != nil || err2 != nil {
		t.Fatalf("guard of %s: in the node %v (%v), on the host %v (%v); want only in the node", br, inNode, err1, onHost, err2)
	}
	out, err := n3.Command(ctx, "ip", "-d", "-o", "link", "show", "dev", vx).CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fmt.Sprintf("mtu %d", OverlayMTU), fmt.Sprintf("vxlan id %d local %s dev eth0", vni, n3.Addr),
		"dstport 4789", "nolearning", "proxy", "master " + br} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("%s in %s lacks %q: %s", vx, n3.Name, want, out)
		}
	}
	if out, err := n3.Command(ctx, "bridge", "-d", "link", "show", "dev", vx).CombinedOutput(); err != nil ||
		!bytes.Contains(out, []byte("learning off")) {
		t.Errorf("bridge port %s: %v: %s; want learning off", vx, err, out)
	}

	r1 := gs[0].attach(t, "10.217.0.11", false)
	r2 := gs[1].attach(t, "10.217.0.12", false)
	r3 := gs[2].attach(t, "10.217.0.13", false)
	if r3.Netns != prefix+"n3-j300-10.217.0.13" {
		t.Errorf("rank netns %s", r3.Netns)
	}
	if !linkExistsIn(ctx, n3.Name, r3.Veth) || LinkExists(r3.Veth) {
		t.Errorf("veth %s not (only) in %s", r3.Veth, n3.Name)
	}
	out, err = r3.Command(ctx, "ip", "-o", "link", "show", "eth0").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte(r3.MAC.String())) || !bytes.Contains(out, []byte(fmt.Sprintf("mtu %d", OverlayMTU))) {
		t.Errorf("rank eth0: %v: %s; want MAC %s, mtu %d", err, out, r3.MAC, OverlayMTU)
	}
	if out, err := r3.Command(ctx, "ip", "route", "show", "default").CombinedOutput(); err != nil || len(out) != 0 {
		t.Errorf("rank default route: %v: %q; want none", err, out)
	}

	p := placement{r1.Addr: 0, r2.Addr: 1, r3.Addr: 2}
	p.setRemotes(t, c, gs)
	before := remotesOf(t, gs[0], c.Nodes[0])
	p.setRemotes(t, c, gs) // idempotent
	if d := cmp.Diff(before, remotesOf(t, gs[0], c.Nodes[0]), cmp.AllowUnexported(remoteEntries{}),
		cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("second SetRemotes changed node 1 (-before +after):\n%s", d)
	}
	stop2 := serveEcho(t, r2, "r2:")
	serveEcho(t, r3, "r3:")
	serveEcho(t, r1, "r1:")
	mustEcho(t, r1, r2.Addr, "r2:")
	mustEcho(t, r2, r3.Addr, "r3:")
	mustEcho(t, r3, r1.Addr, "r1:")

	t.Run("errors", func(t *testing.T) {
		err := gs[0].setRemotes(map[netip.Addr]netip.Addr{r1.Addr: c.Nodes[1].Addr})
		if err == nil || !strings.Contains(err.Error(), "attached to this node") {
			t.Errorf("SetRemotes of a local rank: %v", err)
		}
		err = gs[0].setRemotes(map[netip.Addr]netip.Addr{r2.Addr: c.Nodes[0].Addr})
		if err == nil {
			t.Error("SetRemotes pointing at the node itself succeeded")
		}
		err = gs[0].setRemotes(map[netip.Addr]netip.Addr{netip.MustParseAddr("10.9.9.9"): c.Nodes[1].Addr})
		if err == nil {
			t.Error("SetRemotes of an address outside the subnet succeeded")
		}
		err = gs[0].do(func(ctx context.Context) error { _, err := gs[0].n.AttachRank(ctx, r1.Addr, false); return err })
		if err == nil || !NetnsExists(r1.Netns) {
			t.Errorf("attach over an existing rank netns: %v; netns there: %v", err, NetnsExists(r1.Netns))
		}
		mustEcho(t, r2, r1.Addr, "r1:") // and r1 is untouched
	})

	// Move r2 from node 2 to node 3, which attaches it from inside.
	stop2()
	gs[1].detach(t, r2.Addr)
	gs[1].detach(t, r2.Addr) // missing is fine
	if NetnsExists(r2.Netns) || linkExistsIn(ctx, c.Nodes[1].Name, r2.Veth) {
		t.Fatalf("rank %s still on node 2 after detach", r2.Addr)
	}
	moved := gs[2].attach(t, r2.Addr.String(), false)
	p[moved.Addr] = 2
	p.setRemotes(t, c, gs)
	for i := range 2 {
		if got := remotesOf(t, gs[i], c.Nodes[i]).dst[moved.Addr]; got != n3.Addr {
			t.Errorf("node %d sends %s to %s, want %s", i+1, moved.Addr, got, n3.Addr)
		}
	}
	if e := remotesOf(t, gs[2], n3); e.static[moved.Addr] != moved.Veth || e.dst[moved.Addr].IsValid() {
		t.Errorf("node 3 forwards %s to port %q, vxlan dst %v; want %s only", moved.Addr, e.static[moved.Addr], e.dst[moved.Addr], moved.Veth)
	}
	serveEcho(t, moved, "moved:")
	mustEcho(t, r1, moved.Addr, "moved:")
	mustEcho(t, moved, r1.Addr, "r1:")
	mustEcho(t, moved, r3.Addr, "r3:") // a neighbour on its new node

	// Drop r3, and plant entries a crashed agent might have left on
	// node 1: SetRemotes removes both.
	gs[2].detach(t, r3.Addr)
	delete(p, r3.Addr)
	ghost := netip.MustParseAddr("10.217.0.99")
	ghostMAC, _ := RankMAC(ghost)
	n1 := gs[0].view(c.Nodes[0])
	if err := n1.bridge(ctx, "fdb", "replace", ghostMAC.String(), "dev", n1.VXLANName(), "dst", "10.215.7.99", "self", "permanent"); err != nil {
		t.Fatal(err)
	}
	if err := n1.ip(ctx, "neigh", "replace", ghost.String(), "lladdr", ghostMAC.String(), "dev", n1.VXLANName(), "nud", "permanent"); err != nil {
		t.Fatal(err)
	}
	p.setRemotes(t, c, gs)
	for i := range 3 {
		e := remotesOf(t, gs[i], c.Nodes[i])
		for _, a := range []netip.Addr{r3.Addr, ghost} {
			if _, ok := e.dst[a]; ok {
				t.Errorf("node %d still has a vxlan entry for %s", i+1, a)
			}
			if _, ok := e.static[a]; ok {
				t.Errorf("node %d still has a bridge entry for %s", i+1, a)
			}
			if _, ok := e.neigh[a]; ok {
				t.Errorf("node %d still has a neighbour entry for %s", i+1, a)
			}
		}
	}
	e1 := remotesOf(t, gs[0], c.Nodes[0])
	if len(e1.dst) != 1 || len(e1.neigh) != 1 || e1.dst[moved.Addr] != n3.Addr {
		t.Errorf("node 1 entries %+v; want only %s via %s", e1, moved.Addr, n3.Addr)
	}
	mustEcho(t, r1, moved.Addr, "moved:")

	// Delete removes the node's devices and its ranks; twice is fine.
	for i, g := range gs {
		for range 2 {
			if err := g.do(g.n.Delete); err != nil {
				t.Fatalf("delete on node %d: %v", i+1, err)
			}
		}
		for _, l := range []string{br, vx} {
			if linkExistsIn(ctx, c.Nodes[i].Name, l) {
				t.Errorf("%s left on node %d", l, i+1)
			}
		}
	}
	for _, r := range []Rank{r1, moved} {
		if NetnsExists(r.Netns) {
			t.Errorf("rank netns %s left", r.Netns)
		}
	}
}

// TestJobNetNodeView checks that JobNet and NodeJobNet name and place the
// same things, so an agent can take over a node from JobNet.
func TestJobNetNodeView(t *testing.T) {
	needRoot(t)
	c, prefix := testCluster(t, 2)
	j := testJobNet(t, c, prefix, 301, "10.217.1.0/24")
	r := attach(t, j, c.Nodes[1].Name, "10.217.1.11")
	g := agent{n: j.on(c.Nodes[0])}
	e := remotesOf(t, g, c.Nodes[0])
	if e.dst[r.Addr] != c.Nodes[1].Addr || e.static[r.Addr] != j.VXLANName() || e.neigh[r.Addr] != r.MAC.String() {
		t.Errorf("node 1's entries for %s after JobNet.AttachRank: %+v", r.Addr, e)
	}
	if got := j.on(c.Nodes[1]).RankNetns(r.Addr); got != r.Netns {
		t.Errorf("node view names the rank netns %s, JobNet %s", got, r.Netns)
	}
	if err := g.setRemotes(map[netip.Addr]netip.Addr{r.Addr: c.Nodes[1].Addr}); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(e, remotesOf(t, g, c.Nodes[0]), cmp.AllowUnexported(remoteEntries{}),
		cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("SetRemotes of JobNet's own placement changed node 1 (-before +after):\n%s", d)
	}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil || bytes.Count(out, []byte(prefix)) != 3 { // 2 nodes, 1 rank
		t.Errorf("ip netns list: %v:\n%s", err, out)
	}
}

// TestNodeJobNetHostPorts: with HostPorts, a rank reaches those ports of
// its node at the job's gateway address, and nothing else of the node;
// without, the job bridge has no address.
func TestNodeJobNetHostPorts(t *testing.T) {
	needRoot(t)
	c, prefix := testCluster(t, 1)
	ctx := context.Background()
	open := testAgents(t, c, prefix, 310, "10.217.1.0/24")[0]
	open.n.HostPorts = []uint16{echoPort}
	open.ensure(t)
	r := open.attach(t, "10.217.1.11", false)
	closed := testAgents(t, c, prefix, 311, "10.217.2.0/24")[0]
	closed.ensure(t)
	r2 := closed.attach(t, "10.217.2.11", false)

	// The node listens on the allowed port and on another.
	node := c.Nodes[0]
	for _, port := range []uint16{echoPort, echoPort + 1} {
		var ln net.Listener
		if err := InNetns(node.Path(), func() (err error) {
			ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("node\n"))
				c.Close()
			}
		}()
	}
	dial := func(from Rank, to netip.AddrPort) error {
		return InNetns(from.Path(), func() error {
			c, err := net.DialTimeout("tcp", to.String(), time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(time.Second))
			_, err = c.Read(make([]byte, 5))
			return err
		})
	}
	gw := open.n.Gateway()
	if gw.String() != "10.217.1.1" {
		t.Fatalf("gateway %s", gw)
	}
	if err := dial(r, netip.AddrPortFrom(gw, echoPort)); err != nil {
		t.Fatalf("a rank to its node's allowed port: %v", err)
	}
	if err := dial(r, netip.AddrPortFrom(gw, echoPort+1)); err == nil {
		t.Fatal("a rank reached a port of its node that is not allowed")
	}
	if err := dial(r, netip.AddrPortFrom(node.Addr, echoPort)); err == nil {
		t.Fatal("a rank reached its node's underlay address")
	}
	if out, err := node.Command(ctx, "ip", "-o", "addr", "show", "dev", closed.n.BridgeName()).CombinedOutput(); err != nil || bytes.Contains(out, []byte("inet ")) {
		t.Fatalf("a job bridge without host ports has an address: %v %s", err, out)
	}
	if err := dial(r2, netip.AddrPortFrom(closed.n.Gateway(), echoPort)); err == nil {
		t.Fatal("a rank of a job without host ports reached its node")
	}
}

func TestParseRankNetns(t *testing.T) {
	a := netip.MustParseAddr("10.80.3.7")
	for _, prefix := range []string{"", "cairn-n1-", "x-j5-"} {
		name := rankNetns(prefix, 4242, a)
		vni, got, ok := ParseRankNetns(prefix, name)
		if !ok || vni != 4242 || got != a {
			t.Errorf("ParseRankNetns(%q, %q) = %d, %s, %v; want 4242, %s", prefix, name, vni, got, ok, a)
		}
	}
	for _, name := range []string{
		"", "cairn-n1-", "cairn-n1-j", "cairn-n1-j12", "cairn-n1-j12-", "cairn-n1-jx-10.0.0.1",
		"cairn-n1-j-1-10.0.0.1", "cairn-n1-j012-10.0.0.1", "cairn-n1-j4294967296-10.0.0.1",
		"cairn-n1-j12-10.0.0.1/../..", "cairn-n2-j12-10.0.0.1", "cairn-n1-j12-10.0.0.01",
	} {
		if vni, a, ok := ParseRankNetns("cairn-n1-", name); ok {
			t.Errorf("ParseRankNetns(%q) = %d, %s: want no rank netns", name, vni, a)
		}
	}
}

// TestDevicesAsIproute2Makes: the job's devices and a rank's, which the
// node makes over netlink (Ensure, AttachRank), are what the ip and bridge
// commands that made them before make, attribute for attribute (ip -d link
// show, ip -d addr show, bridge fdb show, bridge link show), but for the
// broadcast address the rank's address now has: made both ways side by
// side on one node, for two jobs.
func TestDevicesAsIproute2Makes(t *testing.T) {
	needRoot(t)
	c, prefix := testCluster(t, 1)
	node := c.Nodes[0]
	g := testAgents(t, c, prefix, 310, "10.217.10.0/24")[0]
	g.ensure(t)
	r := g.attach(t, "10.217.10.11", false)

	// The same by the commands, for job 311.
	ref := NodeJobNet{Netns: node.Name, Local: node.Addr, VNI: 311, Subnet: netip.MustParsePrefix("10.217.11.0/24"), Prefix: prefix + "ref-"}
	t.Cleanup(func() { _ = ref.Delete(context.Background()) })
	refRank, err := ref.rank(netip.MustParseAddr("10.217.11.11"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	mtu := fmt.Sprint(OverlayMTU)
	br, vx := ref.BridgeName(), ref.VXLANName()
	for _, cmd := range [][]string{
		{"ip", "-n", node.Name, "link", "add", br, "mtu", mtu, "type", "bridge"},
		{"ip", "-n", node.Name, "link", "add", vx, "mtu", mtu, "type", "vxlan", "id", "311", "local", node.Addr.String(), "dev", "eth0",
			"dstport", fmt.Sprint(ref.port()), "nolearning", "proxy"},
		{"ip", "-n", node.Name, "link", "set", br, "up"},
		{"ip", "-n", node.Name, "link", "set", vx, "master", br, "up"},
		{"bridge", "-n", node.Name, "link", "set", "dev", vx, "learning", "off"},
		{"ip", "netns", "add", refRank.Netns},
		{"ip", "-n", refRank.Netns, "link", "set", "lo", "up"},
		{"ip", "-n", node.Name, "link", "add", refRank.Veth, "mtu", mtu, "type", "veth",
			"peer", "name", "eth0", "mtu", mtu, "address", refRank.MAC.String(), "netns", refRank.Netns},
		{"ip", "-n", node.Name, "link", "set", refRank.Veth, "master", br, "up"},
		{"bridge", "-n", node.Name, "fdb", "replace", refRank.MAC.String(), "dev", refRank.Veth, "master", "static"},
		{"ip", "-n", refRank.Netns, "addr", "add", "10.217.11.11/24", "dev", "eth0"},
		{"ip", "-n", refRank.Netns, "link", "set", "eth0", "up"},
	} {
		if out, err := exec.CommandContext(ctx, cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	// What may differ: names, numbers, MACs, the bridges' running timers
	// and ids, and the broadcast address.
	brd := regexp.MustCompile(` brd 10\.\S+|inet6 fe80::.*`)
	norm := regexp.MustCompile(`^\d+: |@if\d+|link-netns(id)? \S+|link/ether \S+|(bridge_id|designated_root|id) \S+|` +
		`\w+_timer +\S+|designated_bridge \S+|\b([0-9a-f]{1,2}:){5}[0-9a-f]{1,2}\b|addrgenmode \S+|valid_lft \S+|preferred_lft \S+|\b(jb|vx)31[01]\b|` +
		`\b10\.217\.1[01]\.|` + regexp.QuoteMeta(r.Veth) + `|` + regexp.QuoteMeta(refRank.Veth))
	show := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			lines = append(lines, norm.ReplaceAllString(brd.ReplaceAllString(strings.TrimSpace(l), ""), "X"))
		}
		return strings.Join(lines, "\n")
	}
	for _, pair := range [][2][]string{
		{{"ip", "-n", node.Name, "-d", "link", "show", g.n.BridgeName()}, {"ip", "-n", node.Name, "-d", "link", "show", br}},
		{{"ip", "-n", node.Name, "-d", "link", "show", g.n.VXLANName()}, {"ip", "-n", node.Name, "-d", "link", "show", vx}},
		{{"bridge", "-n", node.Name, "-d", "link", "show", "dev", g.n.VXLANName()}, {"bridge", "-n", node.Name, "-d", "link", "show", "dev", vx}},
		{{"ip", "-n", node.Name, "-d", "link", "show", r.Veth}, {"ip", "-n", node.Name, "-d", "link", "show", refRank.Veth}},
		{{"bridge", "-n", node.Name, "-d", "link", "show", "dev", r.Veth}, {"bridge", "-n", node.Name, "-d", "link", "show", "dev", refRank.Veth}},
		{{"bridge", "-n", node.Name, "fdb", "show", "dev", r.Veth}, {"bridge", "-n", node.Name, "fdb", "show", "dev", refRank.Veth}},
		{{"ip", "-n", r.Netns, "-d", "addr", "show"}, {"ip", "-n", refRank.Netns, "-d", "addr", "show"}},
	} {
		got, want := show(pair[0]...), show(pair[1]...)
		if got != want {
			t.Errorf("%s\n%s\nwant, as iproute2 makes it (%s):\n%s", strings.Join(pair[0], " "), got, strings.Join(pair[1], " "), want)
		}
	}
	if err := ref.DetachRank(ctx, refRank.Addr); err != nil {
		t.Fatal(err)
	}
}
