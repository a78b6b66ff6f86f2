package netw

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
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

// remotes reads the node's forwarding entries of the job's rank MACs.
func (n NodeJobNet) remotes(ctx context.Context) (remoteEntries, error) {
	e := remoteEntries{neigh: map[netip.Addr]string{}, dst: map[netip.Addr]netip.Addr{}, static: map[netip.Addr]string{}}
	vx := n.VXLANName()
	// By bridge rather than by device, to see the entries of local ranks
	// on their veths too.
	out, err := n.output(ctx, "bridge", "-j", "fdb", "show", "br", n.BridgeName())
	if err != nil {
		return e, err
	}
	var fdb []struct {
		MAC    string   `json:"mac"`
		Ifname string   `json:"ifname"`
		Dst    string   `json:"dst"`
		Master string   `json:"master"`
		Flags  []string `json:"flags"`
		State  string   `json:"state"`
	}
	if err := unmarshalJSON(out, &fdb); err != nil {
		return e, fmt.Errorf("parse bridge fdb of %s: %w", n.BridgeName(), err)
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
	out, err = n.output(ctx, "ip", "-j", "neigh", "show", "dev", vx)
	if err != nil {
		return e, err
	}
	var neigh []struct {
		Dst    string   `json:"dst"`
		LLAddr string   `json:"lladdr"`
		State  []string `json:"state"`
	}
	if err := unmarshalJSON(out, &neigh); err != nil {
		return e, fmt.Errorf("parse neighbours of %s: %w", vx, err)
	}
	for _, ne := range neigh {
		a, err := netip.ParseAddr(ne.Dst)
		if err != nil || !n.Subnet.Contains(a) {
			continue
		}
		if slices.Contains(ne.State, "PERMANENT") {
			e.neigh[a] = ne.LLAddr
		} else {
			e.neigh[a] = "" // not ours: replaced if wanted, else removed
		}
	}
	return e, nil
}

// unmarshalJSON decodes iproute2's -j output, where nothing may print as
// nothing at all rather than [].
func unmarshalJSON(out []byte, v any) error {
	if len(bytes.TrimSpace(out)) == 0 {
		return nil
	}
	return json.Unmarshal(out, v)
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
	var ipCmds, brCmds []string
	for a, dst := range want {
		if port, ok := have.static[a]; ok && port != vx {
			return fmt.Errorf("rank %s is attached to this node (bridge port %s), not remote", a, port)
		}
		mac, err := RankMAC(a)
		if err != nil {
			return err
		}
		if have.dst[a] != dst {
			brCmds = append(brCmds, fmt.Sprintf("fdb replace %s dev %s dst %s self permanent", mac, vx, dst))
		}
		if _, ok := have.static[a]; !ok {
			brCmds = append(brCmds, fmt.Sprintf("fdb replace %s dev %s master static", mac, vx))
		}
		if have.neigh[a] != mac.String() {
			ipCmds = append(ipCmds, fmt.Sprintf("neigh replace %s lladdr %s dev %s nud permanent", a, mac, vx))
		}
	}
	stale := func(a netip.Addr) bool {
		_, wanted := want[a]
		return !wanted && inScope(a)
	}
	for a := range have.dst {
		if stale(a) {
			mac, _ := RankMAC(a)
			brCmds = append(brCmds, fmt.Sprintf("fdb del %s dev %s self", mac, vx))
		}
	}
	for a, port := range have.static {
		if port == vx && stale(a) {
			mac, _ := RankMAC(a)
			brCmds = append(brCmds, fmt.Sprintf("fdb del %s dev %s master", mac, vx))
		}
	}
	for a := range have.neigh {
		if stale(a) {
			ipCmds = append(ipCmds, fmt.Sprintf("neigh del %s dev %s", a, vx))
		}
	}
	// Sorted so that a failing batch reads the same every time.
	sort.Strings(brCmds)
	sort.Strings(ipCmds)
	// The filter takes the new nodes first, and lets go of old ones last:
	// a rank's frames are never dropped for a node it is sent to.
	dst := maps.Clone(have.dst)
	maps.Copy(dst, want)
	if err := n.guardVXLAN(ctx, dst); err != nil {
		return err
	}
	// Forwarding before ARP answers: a rank's first frame to a remote
	// rank follows the ARP reply.
	if err := n.batch(ctx, "bridge", brCmds); err != nil {
		return err
	}
	if err := n.batch(ctx, "ip", ipCmds); err != nil {
		return err
	}
	before := len(dst)
	maps.DeleteFunc(dst, func(a, _ netip.Addr) bool { return stale(a) })
	if len(dst) == before {
		return nil // no entry went: the filter is already right
	}
	return n.guardVXLAN(ctx, dst)
}
