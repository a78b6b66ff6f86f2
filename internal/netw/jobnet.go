package netw

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"sort"
	"sync"
)

const (
	// DefaultVXLANPort is IANA's VXLAN port, used when JobNet.Port is 0.
	DefaultVXLANPort = 4789
	// OverlayMTU is the MTU of job bridges, vxlan devices and rank eth0:
	// the underlay's less VXLAN's 50 bytes over IPv4, so a full-sized rank
	// frame never has to be fragmented or dropped at the vxlan device.
	OverlayMTU = UnderlayMTU - 50
	// MaxVNI is the largest VXLAN network identifier (24 bits).
	MaxVNI = 1<<24 - 1
)

// ErrAttached is returned by AttachRank for an address that is already
// attached somewhere in the job network.
var ErrAttached = errors.New("rank address already attached")

// JobNet is one job's private layer-2 network spread over nodes: on every
// node a job bridge with a vxlan device of the job's VNI enslaved to it, and
// one network namespace per rank, attached to the bridge of the node the
// rank runs on. A rank keeps its address (and, derived from it, its MAC)
// wherever it runs.
//
// Forwarding is fully static; nothing is learned and nothing is flooded
// between nodes:
//   - every rank's MAC is RankMAC(its address), so peers' ARP caches stay
//     right when a rank moves;
//   - on the rank's node, the job bridge has a static entry for that MAC on
//     the rank's veth;
//   - on every other node, the vxlan device has a unicast FDB entry sending
//     that MAC to the rank's node's underlay address, the job bridge has a
//     static entry for it on the vxlan port (learning is off there), and the
//     vxlan device, created with `proxy`, has a permanent neighbour entry
//     (rank address → MAC) with which it answers ARP requests locally: ARP
//     never crosses the underlay, and there are no all-zero (flooding) FDB
//     entries at all.
//
// AttachRank and DetachRank update these entries on every node, so a rank
// detached from one node and attached to another is reached at once, with no
// stale bridge entry to age out. The price is that broadcast and multicast
// other than ARP and IPv6 neighbour discovery stay within a node; MPI and
// TCP applications do not need them. Flooding (all-zero FDB entries towards
// every node) would carry them, at the cost of copying every broadcast and
// unknown-unicast frame to every node.
//
// The placement of ranks is kept in memory: one JobNet value must make all
// changes to one job network. Its methods are safe for concurrent use.
type JobNet struct {
	Prefix string       // rank netns names start with it
	VNI    uint32       // 1..MaxVNI; device names in the nodes derive from it
	Subnet netip.Prefix // IPv4 rank addresses
	Port   uint16       // VXLAN UDP port; 0 means DefaultVXLANPort
	Nodes  []Node

	mu    sync.Mutex
	ranks map[netip.Addr]string // attached rank address -> node name
}

// NewJobNet describes a job network; Create makes it.
func NewJobNet(prefix string, vni uint32, subnet netip.Prefix, nodes []Node) *JobNet {
	return &JobNet{Prefix: prefix, VNI: vni, Subnet: subnet.Masked(), Nodes: nodes}
}

// Rank is a rank's network as attached to a node.
type Rank struct {
	Netns string     // rank netns name under /run/netns
	Node  string     // node name
	Addr  netip.Addr // eth0's address
	MAC   net.HardwareAddr
	Veth  string // node side of the veth pair, in the node's netns
}

// Path is the rank's netns bind mount, which runc joins.
func (r Rank) Path() string { return NetnsPath(r.Netns) }

// Command runs name in the rank's network namespace only (see NetnsCommand).
func (r Rank) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return NetnsCommand(ctx, r.Path(), name, args...)
}

// RankMAC is the fixed MAC of the rank with IPv4 address a: locally
// administered unicast 02:ca followed by the address's four bytes.
func RankMAC(a netip.Addr) (net.HardwareAddr, error) {
	if !a.Is4() {
		return nil, fmt.Errorf("rank address %s is not IPv4", a)
	}
	b := a.As4()
	return net.HardwareAddr{0x02, 0xca, b[0], b[1], b[2], b[3]}, nil
}

// BridgeName is the job bridge's name inside every node.
func (j *JobNet) BridgeName() string { return fmt.Sprintf("jb%d", j.VNI) }

// VXLANName is the vxlan device's name inside every node.
func (j *JobNet) VXLANName() string { return fmt.Sprintf("vx%d", j.VNI) }

// RankNetns is the name of the netns of the rank with address a.
func (j *JobNet) RankNetns(a netip.Addr) string { return fmt.Sprintf("%sj%d-%s", j.Prefix, j.VNI, a) }

func (j *JobNet) port() uint16 {
	if j.Port == 0 {
		return DefaultVXLANPort
	}
	return j.Port
}

func (j *JobNet) node(name string) (Node, bool) {
	for _, n := range j.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

func (j *JobNet) rank(node string, a netip.Addr) (Rank, error) {
	mac, err := RankMAC(a)
	if err != nil {
		return Rank{}, err
	}
	b := a.As4()
	veth := fmt.Sprintf("r%06x%02x%02x%02x%02x", j.VNI, b[0], b[1], b[2], b[3])
	return Rank{Netns: j.RankNetns(a), Node: node, Addr: a, MAC: mac, Veth: veth}, nil
}

// Create makes the job bridge and vxlan device on every node, and the
// forwarding entries of ranks already attached. It is idempotent.
func (j *JobNet) Create(ctx context.Context) error {
	if j.VNI == 0 || j.VNI > MaxVNI {
		return fmt.Errorf("VNI %d outside 1..%d", j.VNI, MaxVNI)
	}
	if !j.Subnet.Addr().Is4() {
		return fmt.Errorf("job subnet %s is not IPv4", j.Subnet)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, n := range j.Nodes {
		if err := j.createOn(ctx, n); err != nil {
			return err
		}
	}
	for a, on := range j.ranks {
		r, err := j.rank(on, a)
		if err != nil {
			return err
		}
		if err := j.announce(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

func (j *JobNet) createOn(ctx context.Context, n Node) error {
	br, vx := j.BridgeName(), j.VXLANName()
	mtu := fmt.Sprint(OverlayMTU)
	if !linkExistsIn(ctx, n.Name, br) {
		if err := ip(ctx, "-n", n.Name, "link", "add", br, "mtu", mtu, "type", "bridge"); err != nil {
			return err
		}
	}
	if !linkExistsIn(ctx, n.Name, vx) {
		if err := ip(ctx, "-n", n.Name, "link", "add", vx, "mtu", mtu, "type", "vxlan",
			"id", fmt.Sprint(j.VNI), "local", n.Addr.String(), "dev", "eth0",
			"dstport", fmt.Sprint(j.port()), "nolearning", "proxy"); err != nil {
			return err
		}
	}
	if err := runAll(ctx, ip, [][]string{
		{"-n", n.Name, "link", "set", br, "up"},
		{"-n", n.Name, "link", "set", vx, "master", br, "up"},
	}); err != nil {
		return err
	}
	return bridgeCmd(ctx, "-n", n.Name, "link", "set", "dev", vx, "learning", "off")
}

// Delete removes every rank netns and, on every node, the job's devices.
// Missing pieces are not errors.
func (j *JobNet) Delete(ctx context.Context) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	var errs []error
	for a, on := range j.ranks {
		r, err := j.rank(on, a)
		if err == nil {
			err = deleteRankNetns(ctx, r)
		}
		errs = append(errs, err)
		delete(j.ranks, a)
	}
	for _, n := range j.Nodes {
		if !NetnsExists(n.Name) {
			continue
		}
		for _, l := range []string{j.VXLANName(), j.BridgeName()} {
			if linkExistsIn(ctx, n.Name, l) {
				if err := ip(ctx, "-n", n.Name, "link", "del", l); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// AttachRank creates the netns of the rank with address a on node: lo up,
// eth0 with a and RankMAC(a), joined by a veth to the node's job bridge, and
// no default route (the job subnet is all a rank reaches). It then points
// every other node at it. The address must not be attached anywhere (see
// DetachRank), and a stale netns of that name is an error. On error it
// removes whatever it made.
func (j *JobNet) AttachRank(ctx context.Context, node string, a netip.Addr) (_ Rank, err error) {
	n, ok := j.node(node)
	if !ok {
		return Rank{}, fmt.Errorf("node %s is not in job network %d", node, j.VNI)
	}
	if !j.Subnet.Contains(a) || a == j.Subnet.Addr() {
		return Rank{}, fmt.Errorf("rank address %s is not a host of %s", a, j.Subnet)
	}
	r, err := j.rank(node, a)
	if err != nil {
		return Rank{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if on, ok := j.ranks[a]; ok {
		return Rank{}, fmt.Errorf("%w: %s on %s", ErrAttached, a, on)
	}
	if NetnsExists(r.Netns) {
		return Rank{}, fmt.Errorf("netns %s already exists", r.Netns)
	}
	if err := ip(ctx, "netns", "add", r.Netns); err != nil {
		return Rank{}, err
	}
	defer func() {
		if err != nil {
			ctx := context.WithoutCancel(ctx)
			j.withdraw(ctx, r)
			_ = deleteRankNetns(ctx, r)
		}
	}()
	mtu := fmt.Sprint(OverlayMTU)
	if err := runAll(ctx, ip, [][]string{
		{"-n", r.Netns, "link", "set", "lo", "up"},
		{"-n", n.Name, "link", "add", r.Veth, "mtu", mtu, "type", "veth",
			"peer", "name", "eth0", "mtu", mtu, "address", r.MAC.String(), "netns", r.Netns},
		{"-n", n.Name, "link", "set", r.Veth, "master", j.BridgeName(), "up"},
		{"-n", r.Netns, "addr", "add", netip.PrefixFrom(a, j.Subnet.Bits()).String(), "dev", "eth0"},
		{"-n", r.Netns, "link", "set", "eth0", "up"},
	}); err != nil {
		return Rank{}, err
	}
	if err := j.announce(ctx, r); err != nil {
		return Rank{}, err
	}
	if j.ranks == nil {
		j.ranks = map[netip.Addr]string{}
	}
	j.ranks[a] = node
	return r, nil
}

// DetachRank deletes the netns of the rank with address a and its veth, and
// removes its forwarding entries from every node. A rank that is not
// attached is not an error: whatever is left of it is removed.
func (j *JobNet) DetachRank(ctx context.Context, a netip.Addr) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	r, err := j.rank(j.ranks[a], a)
	if err != nil {
		return err
	}
	j.withdraw(ctx, r) // also finds the veth when the placement is unknown
	err = deleteRankNetns(ctx, r)
	delete(j.ranks, a)
	return err
}

// Locate returns the node the rank with address a is attached to.
func (j *JobNet) Locate(a netip.Addr) (node string, ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	node, ok = j.ranks[a]
	return node, ok
}

// Ranks returns the attached rank addresses in order.
func (j *JobNet) Ranks() []netip.Addr {
	j.mu.Lock()
	defer j.mu.Unlock()
	as := make([]netip.Addr, 0, len(j.ranks))
	for a := range j.ranks {
		as = append(as, a)
	}
	sort.Slice(as, func(x, y int) bool { return as[x].Less(as[y]) })
	return as
}

// announce installs r's forwarding entries: local on r.Node, remote on every
// other node.
func (j *JobNet) announce(ctx context.Context, r Rank) error {
	home, ok := j.node(r.Node)
	if !ok {
		return fmt.Errorf("node %s is not in job network %d", r.Node, j.VNI)
	}
	mac, vx := r.MAC.String(), j.VXLANName()
	for _, n := range j.Nodes {
		if n.Name == r.Node {
			unsetRemote(ctx, n, vx, r) // left over from an earlier placement
			if err := bridgeCmd(ctx, "-n", n.Name, "fdb", "replace", mac, "dev", r.Veth, "master", "static"); err != nil {
				return err
			}
			continue
		}
		if err := bridgeCmd(ctx, "-n", n.Name, "fdb", "replace", mac, "dev", vx,
			"dst", home.Addr.String(), "self", "permanent"); err != nil {
			return err
		}
		if err := bridgeCmd(ctx, "-n", n.Name, "fdb", "replace", mac, "dev", vx, "master", "static"); err != nil {
			return err
		}
		if err := ip(ctx, "-n", n.Name, "neigh", "replace", r.Addr.String(),
			"lladdr", mac, "dev", vx, "nud", "permanent"); err != nil {
			return err
		}
	}
	return nil
}

// withdraw removes r's forwarding entries and veth from every node, best
// effort: entries that are not there are the normal case.
func (j *JobNet) withdraw(ctx context.Context, r Rank) {
	vx := j.VXLANName()
	for _, n := range j.Nodes {
		if !NetnsExists(n.Name) {
			continue
		}
		if linkExistsIn(ctx, n.Name, r.Veth) {
			_ = ip(ctx, "-n", n.Name, "link", "del", r.Veth)
		}
		unsetRemote(ctx, n, vx, r)
	}
}

// unsetRemote removes the entries that send r's traffic from n over VXLAN.
// Errors mean the entries were not there.
func unsetRemote(ctx context.Context, n Node, vx string, r Rank) {
	mac := r.MAC.String()
	_ = ip(ctx, "-n", n.Name, "neigh", "del", r.Addr.String(), "dev", vx)
	_ = bridgeCmd(ctx, "-n", n.Name, "fdb", "del", mac, "dev", vx, "master")
	_ = bridgeCmd(ctx, "-n", n.Name, "fdb", "del", mac, "dev", vx, "self")
}

// deleteRankNetns deletes r's veth, when r.Node is known, and r's netns.
// The veth goes first and explicitly: the kernel destroys a namespace's
// devices asynchronously once its last reference is gone, and a veth left
// for a moment in the node would make an immediate re-attach there fail.
func deleteRankNetns(ctx context.Context, r Rank) error {
	var errs []error
	if r.Node != "" && NetnsExists(r.Node) && linkExistsIn(ctx, r.Node, r.Veth) {
		if err := ip(ctx, "-n", r.Node, "link", "del", r.Veth); err != nil && linkExistsIn(ctx, r.Node, r.Veth) {
			errs = append(errs, err)
		}
	}
	if NetnsExists(r.Netns) {
		if err := ip(ctx, "netns", "del", r.Netns); err != nil && NetnsExists(r.Netns) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// linkExistsIn reports whether the named netns has a link called name.
func linkExistsIn(ctx context.Context, netns, name string) bool {
	return exec.CommandContext(ctx, "ip", "-n", netns, "link", "show", "dev", name).Run() == nil
}
