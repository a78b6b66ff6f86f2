package netw

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// SetRemotes makes the node send the job's traffic for each rank address
// in remotes over VXLAN to the underlay address it maps to, the node the
// rank runs on: a unicast entry in the vxlan device's FDB, a static bridge
// entry on the vxlan port and a permanent neighbour entry with which the
// vxlan device answers ARP for the rank. It removes such entries for every
// other address of the job subnet, so the node converges to exactly the
// given set; entries already right are left alone. Ranks attached to this
// node must not be listed.
func (n NodeJobNet) SetRemotes(ctx context.Context, remotes map[netip.Addr]netip.Addr) error {
	for a, dst := range remotes {
		if err := checkHost(n.Subnet, a); err != nil {
			return err
		}
		if !dst.Is4() {
			return fmt.Errorf("node address %s of rank %s is not IPv4", dst, a)
		}
		if dst == n.Local {
			return fmt.Errorf("rank %s listed as remote at this node's own address %s", a, dst)
		}
	}
	return n.syncRemotes(ctx, remotes, n.Subnet.Contains)
}

// remoteEntries is what the node forwards over VXLAN, by rank address.
type remoteEntries struct {
	neigh  map[netip.Addr]string     // proxy ARP entry on the vxlan device: MAC
	dst    map[netip.Addr]netip.Addr // vxlan FDB entry: underlay destination
	static map[netip.Addr]string     // static bridge entry: port name
}

// remotes reads the node's forwarding entries of the job's rank MACs, as
// `bridge fdb show br BRIDGE` and `ip neigh show dev VXLAN` show them
// (remotesFromTools in the tests reads them so and compares), over
// netlink.
func (n NodeJobNet) remotes(ctx context.Context) (remoteEntries, error) {
	e := remoteEntries{neigh: map[netip.Addr]string{}, dst: map[netip.Addr]netip.Addr{}, static: map[netip.Addr]string{}}
	if err := ctx.Err(); err != nil {
		return e, err
	}
	node, err := openRTNL(n.Netns)
	if err != nil {
		return e, err
	}
	defer node.Close()
	br, err := node.link(n.BridgeName())
	if err != nil {
		return e, err
	}
	vx, err := node.link(n.VXLANName())
	if err != nil {
		return e, err
	}
	links, err := node.h.LinkList()
	if err != nil {
		return e, fmt.Errorf("list links%s: %w", node.where(), err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	// Every bridge entry of the namespace: those of the job's bridge
	// (static, on its ports, the vxlan device's and the local ranks'
	// veths) and the vxlan device's own (its destinations).
	fdb, err := node.h.NeighListExecute(netlink.Ndmsg{Family: unix.AF_BRIDGE})
	if err != nil {
		return e, fmt.Errorf("bridge entries%s: %w", node.where(), err)
	}
	for _, f := range fdb {
		a, ok := rankAddr(f.HardwareAddr.String())
		if !ok || !n.Subnet.Contains(a) {
			continue
		}
		switch {
		case f.LinkIndex == vx.Attrs().Index && f.Flags&netlink.NTF_SELF != 0 && f.IP != nil:
			if d, ok := netip.AddrFromSlice(f.IP); ok {
				e.dst[a] = d.Unmap()
			}
		case f.MasterIndex == br.Attrs().Index && f.State&netlink.NUD_PERMANENT == 0 && f.State&netlink.NUD_NOARP != 0:
			e.static[a] = names[f.LinkIndex]
		}
	}
	neigh, err := node.h.NeighList(vx.Attrs().Index, unix.AF_INET)
	if err != nil {
		return e, fmt.Errorf("neighbours of %s%s: %w", n.VXLANName(), node.where(), err)
	}
	for _, ne := range neigh {
		a, ok := netip.AddrFromSlice(ne.IP)
		if !ok || !n.Subnet.Contains(a.Unmap()) {
			continue
		}
		a = a.Unmap()
		switch {
		case ne.State&^netlink.NUD_NOARP&0xff == 0:
			// Not shown by ip neigh show, nor ours.
		case ne.State&netlink.NUD_PERMANENT != 0:
			e.neigh[a] = ne.HardwareAddr.String()
		default:
			e.neigh[a] = "" // not ours: replaced if wanted, else removed
		}
	}
	return e, nil
}

// neighChange is one change of a forwarding entry of the vxlan device:
// what, as the bridge or ip command that would make it, for errors.
type neighChange struct {
	what string
	n    netlink.Neigh // its LinkIndex is set when applied
	del  bool
	arp  bool // a neighbour (ARP) entry, not a bridge one
}

// applyNeigh makes the changes on the job's vxlan device, in order.
func (n NodeJobNet) applyNeigh(changes []neighChange) error {
	if len(changes) == 0 {
		return nil
	}
	node, err := openRTNL(n.Netns)
	if err != nil {
		return err
	}
	defer node.Close()
	vx, err := node.link(n.VXLANName())
	if err != nil {
		return err
	}
	for _, c := range changes {
		c.n.LinkIndex = vx.Attrs().Index
		if c.del {
			err = node.h.NeighDel(&c.n)
		} else {
			err = node.h.NeighSet(&c.n)
		}
		if err != nil {
			return fmt.Errorf("%s%s: %w", c.what, node.where(), err)
		}
	}
	return nil
}

// syncRemotes makes the node's remote entries of the addresses for which
// inScope is true exactly want (rank address -> node underlay address),
// changing only what differs.
func (n NodeJobNet) syncRemotes(ctx context.Context, want map[netip.Addr]netip.Addr, inScope func(netip.Addr) bool) error {
	have, err := n.remotes(ctx)
	if err != nil {
		return err
	}
	vx := n.VXLANName()
	var changes []neighChange
	for a, dst := range want {
		if port, ok := have.static[a]; ok && port != vx {
			return fmt.Errorf("rank %s is attached to this node (bridge port %s), not remote", a, port)
		}
		mac, err := RankMAC(a)
		if err != nil {
			return err
		}
		if have.dst[a] != dst {
			changes = append(changes, neighChange{what: fmt.Sprintf("fdb replace %s dev %s dst %s self permanent", mac, vx, dst),
				n: netlink.Neigh{Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT, HardwareAddr: mac, IP: dst.AsSlice()}})
		}
		if _, ok := have.static[a]; !ok {
			changes = append(changes, neighChange{what: fmt.Sprintf("fdb replace %s dev %s master static", mac, vx),
				n: netlink.Neigh{Family: unix.AF_BRIDGE, Flags: netlink.NTF_MASTER, State: netlink.NUD_NOARP, HardwareAddr: mac}})
		}
		if have.neigh[a] != mac.String() {
			changes = append(changes, neighChange{what: fmt.Sprintf("neigh replace %s lladdr %s dev %s nud permanent", a, mac, vx), arp: true,
				n: netlink.Neigh{Family: unix.AF_INET, State: netlink.NUD_PERMANENT, IP: a.AsSlice(), HardwareAddr: mac}})
		}
	}
	stale := func(a netip.Addr) bool {
		_, wanted := want[a]
		return !wanted && inScope(a)
	}
	for a, d := range have.dst {
		if stale(a) {
			// With its destination: netlink.Neigh always sends one, and
			// the vxlan device refuses an empty one. The entry has no
			// other (SetRemotes replaces it), so it goes whole.
			mac, _ := RankMAC(a)
			changes = append(changes, neighChange{what: fmt.Sprintf("fdb del %s dev %s dst %s self", mac, vx, d), del: true,
				n: netlink.Neigh{Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, HardwareAddr: mac, IP: d.AsSlice()}})
		}
	}
	for a, port := range have.static {
		if port == vx && stale(a) {
			mac, _ := RankMAC(a)
			changes = append(changes, neighChange{what: fmt.Sprintf("fdb del %s dev %s master", mac, vx), del: true,
				n: netlink.Neigh{Family: unix.AF_BRIDGE, Flags: netlink.NTF_MASTER, HardwareAddr: mac}})
		}
	}
	for a := range have.neigh {
		if stale(a) {
			changes = append(changes, neighChange{what: fmt.Sprintf("neigh del %s dev %s", a, vx), del: true, arp: true,
				n: netlink.Neigh{Family: unix.AF_INET, IP: a.AsSlice()}})
		}
	}
	// Sorted so that a failure reads the same every time, and forwarding
	// before ARP answers: a rank's first frame to a remote rank follows
	// the ARP reply.
	slices.SortFunc(changes, func(x, y neighChange) int {
		if x.arp != y.arp {
			if x.arp {
				return 1
			}
			return -1
		}
		return strings.Compare(x.what, y.what)
	})
	// The filter takes the new nodes first, and lets go of old ones last:
	// a rank's frames are never dropped for a node it is sent to.
	dst := maps.Clone(have.dst)
	maps.Copy(dst, want)
	if err := n.guardVXLAN(ctx, dst); err != nil {
		return err
	}
	if err := n.applyNeigh(changes); err != nil {
		return err
	}
	before := len(dst)
	maps.DeleteFunc(dst, func(a, _ netip.Addr) bool { return stale(a) })
	if len(dst) == before {
		return nil // no entry went: the filter is already right
	}
	return n.guardVXLAN(ctx, dst)
}
