package netw

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// rtnl is a routing netlink handle in one network namespace. What a rank's
// start, restore and move do to its links, addresses and bridge entry goes
// to the kernel as requests on it, not as an exec of ip or bridge each: an
// exec costs several milliseconds on an idle node, and tens under the load
// of other ranks' dumps, where a request costs microseconds.
type rtnl struct {
	h  *netlink.Handle
	ns string // the netns's name, "" for this process's own: for errors
}

// openRTNL opens a handle in the named netns (under NetnsDir), or in this
// process's own for "".
func openRTNL(netns string) (*rtnl, error) {
	if netns == "" {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
		return &rtnl{h: h}, nil
	}
	ns, err := vnetns.GetFromPath(NetnsPath(netns))
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", netns, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink in netns %s: %w", netns, err)
	}
	return &rtnl{h: h, ns: netns}, nil
}

func (r *rtnl) Close() { r.h.Close() }

// where is " in netns NAME", or nothing for this process's own.
func (r *rtnl) where() string {
	if r.ns == "" {
		return ""
	}
	return " in netns " + r.ns
}

// link returns the link called name.
func (r *rtnl) link(name string) (netlink.Link, error) {
	l, err := r.h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("link %s%s: %w", name, r.where(), err)
	}
	return l, nil
}

// hasLink reports whether a link called name is there.
func (r *rtnl) hasLink(name string) bool {
	_, err := r.h.LinkByName(name)
	return err == nil
}

// up brings the link called name up.
func (r *rtnl) up(name string) error {
	l, err := r.link(name)
	if err != nil {
		return err
	}
	if err := r.h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up%s: %w", name, r.where(), err)
	}
	return nil
}

// addVeth adds the veth pair name (here) and peer, with MAC peerMAC, in
// the netns at peerNetns, both with mtu.
func (r *rtnl) addVeth(name, peer string, peerMAC net.HardwareAddr, peerNetns string, mtu int) error {
	f, err := os.Open(peerNetns)
	if err != nil {
		return err
	}
	defer f.Close()
	v := &netlink.Veth{
		LinkAttrs: linkAttrs(name, mtu),
		PeerName:  peer, PeerHardwareAddr: peerMAC, PeerMTU: uint32(mtu), PeerTxQLen: -1,
		PeerNamespace: netlink.NsFd(int(f.Fd())),
	}
	if err := r.h.LinkAdd(v); err != nil {
		return fmt.Errorf("add veth %s%s (peer %s in %s): %w", name, r.where(), peer, peerNetns, err)
	}
	return nil
}

// linkAttrs are the attributes of a new link called name with mtu, the
// others left to the kernel's defaults, as ip link add leaves them.
func linkAttrs(name string, mtu int) netlink.LinkAttrs {
	a := netlink.NewLinkAttrs()
	a.Name, a.MTU = name, mtu
	return a
}

// addLink adds l.
func (r *rtnl) addLink(l netlink.Link) error {
	if err := r.h.LinkAdd(l); err != nil {
		return fmt.Errorf("add %s %s%s: %w", l.Type(), l.Attrs().Name, r.where(), err)
	}
	return nil
}

// enslave makes the link called name a port of bridge and brings it up.
func (r *rtnl) enslave(name, bridge string) error {
	l, err := r.link(name)
	if err != nil {
		return err
	}
	br, err := r.link(bridge)
	if err != nil {
		return err
	}
	if err := r.h.LinkSetMasterByIndex(l, br.Attrs().Index); err != nil {
		return fmt.Errorf("set %s master %s%s: %w", name, bridge, r.where(), err)
	}
	if err := r.h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up%s: %w", name, r.where(), err)
	}
	return nil
}

// staticEntry sets the static bridge entry of mac on the bridge port
// called port, as `bridge fdb replace MAC dev PORT master static` does.
func (r *rtnl) staticEntry(mac net.HardwareAddr, port string) error {
	l, err := r.link(port)
	if err != nil {
		return err
	}
	err = r.h.NeighSet(&netlink.Neigh{
		LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE,
		Flags: netlink.NTF_MASTER, State: netlink.NUD_NOARP, HardwareAddr: mac,
	})
	if err != nil {
		return fmt.Errorf("static bridge entry %s on %s%s: %w", mac, port, r.where(), err)
	}
	return nil
}

// addAddr gives the link called name the address p, with its broadcast
// address (as Docker's and CNI's bridge networks give it; ip addr add
// without brd gave none).
func (r *rtnl) addAddr(name string, p netip.Prefix) error {
	l, err := r.link(name)
	if err != nil {
		return err
	}
	ipn := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
	if err := r.h.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
		return fmt.Errorf("add address %s to %s%s: %w", p, name, r.where(), err)
	}
	return nil
}

// delLink deletes the link called name; one that is not there is no error.
func (r *rtnl) delLink(name string) error {
	l, err := r.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("link %s%s: %w", name, r.where(), err)
	}
	if err := r.h.LinkDel(l); err != nil && r.hasLink(name) {
		return fmt.Errorf("delete link %s%s: %w", name, r.where(), err)
	}
	return nil
}
