package netw

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
)

// NodeJobNet is one job's network as seen from one node: what an agent,
// which runs in its node's network namespace (or on a real host),
// configures there. It makes the same devices, rank namespaces and
// forwarding entries as JobNet makes on that node, so the two describe one
// design (see JobNet); JobNet is a NodeJobNet per node plus the placement
// of every rank, while a NodeJobNet knows only what it is told: its own
// ranks, and through SetRemotes where every other rank runs.
//
// A NodeJobNet holds no state, so its methods may run from any process on
// the node, one at a time per job.
type NodeJobNet struct {
	// Netns is the node's netns name under /run/netns; "" means the
	// calling process's own network namespace.
	Netns  string
	Local  netip.Addr   // the node's underlay address, the VXLAN source
	Dev    string       // underlay device; "" means eth0
	VNI    uint32       // 1..MaxVNI; device names derive from it
	Subnet netip.Prefix // IPv4 rank addresses
	Port   uint16       // VXLAN UDP port; 0 means DefaultVXLANPort
	// Prefix starts the names of rank netns. Several nodes of a cluster on
	// one machine share /run/netns, so it must tell them apart there, and
	// no node's Prefix may start another's: "cairn-n1-" and "cairn-n10-",
	// not "cairn-n1" and "cairn-n10".
	Prefix string
	// HostPorts are the TCP ports of the node that the job's ranks may
	// connect to, at Gateway (the job bridge's address on every node: a
	// rank reaches its own node's). Nothing else of the node answers them;
	// with none, the bridge has no address.
	HostPorts []uint16
}

// Gateway is the address of the job bridge on every node when HostPorts
// are open: the subnet's first host address, which no rank gets.
func (n NodeJobNet) Gateway() netip.Addr { return n.Subnet.Masked().Addr().Next() }

// BridgeName is the job bridge's name in the node.
func (n NodeJobNet) BridgeName() string { return bridgeName(n.VNI) }

// VXLANName is the vxlan device's name in the node.
func (n NodeJobNet) VXLANName() string { return vxlanName(n.VNI) }

// RankNetns is the name of the netns of the rank with address a.
func (n NodeJobNet) RankNetns(a netip.Addr) string { return rankNetns(n.Prefix, n.VNI, a) }

func bridgeName(vni uint32) string { return fmt.Sprintf("jb%d", vni) }
func vxlanName(vni uint32) string  { return fmt.Sprintf("vx%d", vni) }

// rankNetnsPrefix starts the netns names of all ranks of job vni named
// with prefix; the rank's address follows it.
func rankNetnsPrefix(prefix string, vni uint32) string { return fmt.Sprintf("%sj%d-", prefix, vni) }

func rankNetns(prefix string, vni uint32, a netip.Addr) string {
	return rankNetnsPrefix(prefix, vni) + a.String()
}

// ParseRankNetns is the inverse of a rank's netns name made with prefix:
// the job's VNI and the rank's address. ok is false for any other name.
func ParseRankNetns(prefix, name string) (vni uint32, a netip.Addr, ok bool) {
	rest, found := strings.CutPrefix(name, prefix+"j")
	if !found {
		return 0, netip.Addr{}, false
	}
	num, addr, found := strings.Cut(rest, "-")
	if !found {
		return 0, netip.Addr{}, false
	}
	v, err := strconv.ParseUint(num, 10, 32)
	if err != nil {
		return 0, netip.Addr{}, false
	}
	a, err = netip.ParseAddr(addr)
	if err != nil || rankNetns(prefix, uint32(v), a) != name {
		return 0, netip.Addr{}, false
	}
	return uint32(v), a, true
}

// newRank names the pieces of the rank with address a on node. The veth
// name holds the VNI and the address so that it is unique in the node
// across jobs, yet fits the kernel's 15 bytes.
func newRank(prefix string, vni uint32, node string, a netip.Addr) (Rank, error) {
	mac, err := RankMAC(a)
	if err != nil {
		return Rank{}, err
	}
	b := a.As4()
	veth := fmt.Sprintf("r%06x%02x%02x%02x%02x", vni, b[0], b[1], b[2], b[3])
	return Rank{Netns: rankNetns(prefix, vni, a), Node: node, Addr: a, MAC: mac, Veth: veth}, nil
}

// rankAddr is the inverse of RankMAC; ok is false for other MACs.
func rankAddr(mac string) (netip.Addr, bool) {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 || hw[0] != 0x02 || hw[1] != 0xca {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(hw[2:])), true
}

// checkJob validates what every node of a job must agree on.
func checkJob(vni uint32, subnet netip.Prefix) error {
	if vni == 0 || vni > MaxVNI {
		return fmt.Errorf("VNI %d outside 1..%d", vni, MaxVNI)
	}
	if !subnet.Addr().Is4() {
		return fmt.Errorf("job subnet %s is not IPv4", subnet)
	}
	return nil
}

// checkHost fails unless a can be a rank's address in subnet.
func checkHost(subnet netip.Prefix, a netip.Addr) error {
	if !subnet.Contains(a) || a == subnet.Masked().Addr() {
		return fmt.Errorf("rank address %s is not a host of %s", a, subnet)
	}
	return nil
}

func (n NodeJobNet) port() uint16 {
	if n.Port == 0 {
		return DefaultVXLANPort
	}
	return n.Port
}

func (n NodeJobNet) dev() string {
	if n.Dev == "" {
		return "eth0"
	}
	return n.Dev
}

// ip runs ip in the node's netns.
func (n NodeJobNet) ip(ctx context.Context, args ...string) error {
	return ip(ctx, netnsArgs(n.Netns, args)...)
}

// bridge runs bridge in the node's netns.
func (n NodeJobNet) bridge(ctx context.Context, args ...string) error {
	return bridgeCmd(ctx, netnsArgs(n.Netns, args)...)
}

func (n NodeJobNet) hasLink(ctx context.Context, name string) bool {
	return linkExistsIn(ctx, n.Netns, name)
}

// netnsArgs prefixes args with iproute2's -n netns, unless netns is "".
func netnsArgs(netns string, args []string) []string {
	if netns == "" {
		return args
	}
	return append([]string{"-n", netns}, args...)
}

func (n NodeJobNet) rank(a netip.Addr) (Rank, error) {
	return newRank(n.Prefix, n.VNI, n.Netns, a)
}

// Ensure makes the job bridge and the vxlan device, enslaved to it, if they
// do not exist, and brings them up. It is idempotent.
func (n NodeJobNet) Ensure(ctx context.Context) error {
	if err := checkJob(n.VNI, n.Subnet); err != nil {
		return err
	}
	// OverlayMTU leaves room for VXLAN over IPv4 only.
	if !n.Local.Is4() {
		return fmt.Errorf("underlay address %s is not IPv4", n.Local)
	}
	br, vx := n.BridgeName(), n.VXLANName()
	node, err := openRTNL(n.Netns)
	if err != nil {
		return err
	}
	defer node.Close()
	if !node.hasLink(br) {
		if err := node.addLink(&netlink.Bridge{LinkAttrs: linkAttrs(br, OverlayMTU)}); err != nil {
			return err
		}
	}
	if !node.hasLink(vx) {
		dev, err := node.link(n.dev())
		if err != nil {
			return err
		}
		// nolearning and proxy: forwarding and ARP come only from the
		// static entries SetRemotes installs (see JobNet).
		err = node.addLink(&netlink.Vxlan{LinkAttrs: linkAttrs(vx, OverlayMTU),
			VxlanId: int(n.VNI), SrcAddr: n.Local.AsSlice(), VtepDevIndex: dev.Attrs().Index,
			Port: int(n.port()), Learning: false, Proxy: true})
		if err != nil {
			return err
		}
	}
	if err := node.up(br); err != nil {
		return err
	}
	if err := node.enslave(vx, br); err != nil {
		return err
	}
	vxl, err := node.link(vx)
	if err != nil {
		return err
	}
	if err := node.h.LinkSetLearning(vxl, false); err != nil {
		return fmt.Errorf("set %s learning off: %w", vx, err)
	}
	// A job bridge has an address only when ranks may reach ports of
	// their node (HostPorts); even without one, a rank must not reach its
	// node's listeners (the agent) by crafting frames to the bridge's MAC.
	if len(n.HostPorts) > 0 {
		gw := netip.PrefixFrom(n.Gateway(), n.Subnet.Bits())
		if err := n.ip(ctx, "addr", "replace", gw.String(), "dev", br); err != nil {
			return err
		}
	}
	if err := Guard(ctx, netnsPathOf(n.Netns), br, n.HostPorts); err != nil {
		return err
	}
	return n.ensureVXLANGuard(ctx)
}

// ensureVXLANGuard gives the job a VXLAN filter that takes nothing if it
// has none, so that nothing is taken before the job's nodes are named:
// every change of the forwarding entries (syncRemotes) sets its peers to
// all the nodes the vxlan device sends to.
func (n NodeJobNet) ensureVXLANGuard(ctx context.Context) error {
	path := netnsPathOf(n.Netns)
	_, ok, err := vxlanPeers(ctx, path, n.VNI)
	if err != nil || ok {
		return err
	}
	return guardVXLAN(ctx, path, n.VNI, n.port(), nil)
}

// guardVXLAN takes the job's VXLAN only from the nodes in dst, the
// underlay destinations of its remote ranks (see vxlanguard.go, which
// leaves an unchanged set as it is).
func (n NodeJobNet) guardVXLAN(ctx context.Context, dst map[netip.Addr]netip.Addr) error {
	var peers []netip.Addr
	for _, d := range dst {
		if !slices.Contains(peers, d) {
			peers = append(peers, d)
		}
	}
	return guardVXLAN(ctx, netnsPathOf(n.Netns), n.VNI, n.port(), peers)
}

// Delete removes every rank netns of the job named with Prefix, with its
// veth, and the job's devices in the node. Missing pieces, the node's netns
// included, are not errors.
func (n NodeJobNet) Delete(ctx context.Context) error {
	var errs []error
	ranks, err := n.rankNetnsAddrs()
	if err != nil {
		errs = append(errs, err)
	}
	for _, a := range ranks {
		errs = append(errs, n.DetachRank(ctx, a))
	}
	if n.Netns == "" || NetnsExists(n.Netns) {
		if err := Unguard(ctx, netnsPathOf(n.Netns), n.BridgeName()); err != nil {
			errs = append(errs, err)
		}
		if err := unguardVXLAN(ctx, netnsPathOf(n.Netns), n.VNI); err != nil {
			errs = append(errs, err)
		}
		for _, l := range []string{n.VXLANName(), n.BridgeName()} {
			if n.hasLink(ctx, l) {
				if err := n.ip(ctx, "link", "del", l); err != nil && n.hasLink(ctx, l) {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// rankNetnsAddrs lists the addresses of the job's ranks that have a netns
// named with Prefix.
func (n NodeJobNet) rankNetnsAddrs() ([]netip.Addr, error) {
	ents, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	p := rankNetnsPrefix(n.Prefix, n.VNI)
	var as []netip.Addr
	for _, e := range ents {
		s, ok := strings.CutPrefix(e.Name(), p)
		if !ok {
			continue
		}
		if a, err := netip.ParseAddr(s); err == nil && n.Subnet.Contains(a) {
			as = append(as, a)
		}
	}
	return as, nil
}

// AttachRank creates the netns of the rank with address a and joins it to
// the node's job bridge: lo up, eth0 with a and RankMAC(a), a veth to the
// bridge with a static bridge entry for the MAC, and no default route (the
// job subnet is all a rank reaches). Forwarding entries that sent a to
// another node are removed. With locked, the netns is locked (LockNetns)
// before anything else is set up, so that a rank restored into it sends and
// receives nothing until UnlockNetns. A netns of that name must not exist.
// On error it removes whatever it made.
func (n NodeJobNet) AttachRank(ctx context.Context, a netip.Addr, locked bool) (_ Rank, err error) {
	if err := checkJob(n.VNI, n.Subnet); err != nil {
		return Rank{}, err
	}
	if err := checkHost(n.Subnet, a); err != nil {
		return Rank{}, err
	}
	r, err := n.rank(a)
	if err != nil {
		return Rank{}, err
	}
	if NetnsExists(r.Netns) {
		return Rank{}, fmt.Errorf("netns %s already exists", r.Netns)
	}
	if err := ip(ctx, "netns", "add", r.Netns); err != nil {
		return Rank{}, err
	}
	defer func() {
		if err != nil {
			_ = n.DetachRank(context.WithoutCancel(ctx), a)
		}
	}()
	if locked {
		if err := LockNetns(ctx, r.Path()); err != nil {
			return Rank{}, err
		}
	}
	node, err := openRTNL(n.Netns)
	if err != nil {
		return Rank{}, err
	}
	defer node.Close()
	in, err := openRTNL(r.Netns)
	if err != nil {
		return Rank{}, err
	}
	defer in.Close()
	if err := in.up("lo"); err != nil {
		return Rank{}, err
	}
	if err := node.addVeth(r.Veth, "eth0", r.MAC, r.Path(), OverlayMTU); err != nil {
		return Rank{}, err
	}
	if err := node.enslave(r.Veth, n.BridgeName()); err != nil {
		return Rank{}, err
	}
	if err := n.claim(ctx, r); err != nil {
		return Rank{}, err
	}
	if err := in.addAddr("eth0", netip.PrefixFrom(a, n.Subnet.Bits())); err != nil {
		return Rank{}, err
	}
	if err := in.up("eth0"); err != nil {
		return Rank{}, err
	}
	return r, nil
}

// claim points the node's forwarding for r at r's veth, dropping entries
// left from a placement of r on another node.
func (n NodeJobNet) claim(ctx context.Context, r Rank) error {
	if err := n.syncRemotes(ctx, nil, func(a netip.Addr) bool { return a == r.Addr }); err != nil {
		return err
	}
	node, err := openRTNL(n.Netns)
	if err != nil {
		return err
	}
	defer node.Close()
	return node.staticEntry(r.MAC, r.Veth)
}

// DetachRank deletes the veth and the netns of the rank with address a.
// Missing pieces are not errors.
func (n NodeJobNet) DetachRank(ctx context.Context, a netip.Addr) error {
	r, err := n.rank(a)
	if err != nil {
		return err
	}
	var errs []error
	// The veth first and explicitly: the kernel destroys a namespace's
	// devices asynchronously once its last reference is gone, and a veth
	// left for a moment in the node would make an immediate re-attach
	// there fail.
	if n.Netns == "" || NetnsExists(n.Netns) {
		node, err := openRTNL(n.Netns)
		if err == nil {
			err = node.delLink(r.Veth)
			node.Close()
		}
		errs = append(errs, err)
	}
	errs = append(errs, deleteNetns(ctx, r.Netns))
	return errors.Join(errs...)
}
