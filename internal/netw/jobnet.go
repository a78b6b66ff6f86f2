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
	Node  string     // node name; "" when attached by a NodeJobNet from inside its node
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
func (j *JobNet) BridgeName() string { return bridgeName(j.VNI) }

// VXLANName is the vxlan device's name inside every node.
func (j *JobNet) VXLANName() string { return vxlanName(j.VNI) }

// RankNetns is the name of the netns of the rank with address a.
func (j *JobNet) RankNetns(a netip.Addr) string { return rankNetns(j.Prefix, j.VNI, a) }

// on is the job network as node n sees it. All nodes share j.Prefix: the
// placement, not the name, tells which node a rank netns belongs to.
func (j *JobNet) on(n Node) NodeJobNet {
	return NodeJobNet{Netns: n.Name, Local: n.Addr, VNI: j.VNI, Subnet: j.Subnet, Port: j.Port, Prefix: j.Prefix}
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
	return newRank(j.Prefix, j.VNI, node, a)
}

// Create makes the job bridge and vxlan device on every node, and the
// forwarding entries of ranks already attached. It is idempotent.
func (j *JobNet) Create(ctx context.Context) error {
	if err := checkJob(j.VNI, j.Subnet); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, n := range j.Nodes {
		if err := j.on(n).Ensure(ctx); err != nil {
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

// Delete removes every rank netns and, on every node, the job's devices.
// Missing pieces are not errors.
func (j *JobNet) Delete(ctx context.Context) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	var errs []error
	for a, on := range j.ranks {
		// On its own node first, so that the rank's veth goes with it.
		if n, ok := j.node(on); ok {
			errs = append(errs, j.on(n).DetachRank(ctx, a))
		}
		delete(j.ranks, a)
	}
	for _, n := range j.Nodes {
		errs = append(errs, j.on(n).Delete(ctx))
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
	if err := checkHost(j.Subnet, a); err != nil {
		return Rank{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if on, ok := j.ranks[a]; ok {
		return Rank{}, fmt.Errorf("%w: %s on %s", ErrAttached, a, on)
	}
	r, err := j.on(n).AttachRank(ctx, a, false)
	if err != nil {
		return Rank{}, err
	}
	defer func() {
		if err != nil {
			ctx := context.WithoutCancel(ctx)
			j.withdraw(ctx, r)
			_ = deleteNetns(ctx, r.Netns)
		}
	}()
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
	err = deleteNetns(ctx, r.Netns)
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
	remote := map[netip.Addr]netip.Addr{r.Addr: home.Addr}
	for _, n := range j.Nodes {
		var err error
		if n.Name == r.Node {
			err = j.on(n).claim(ctx, r)
		} else {
			err = j.on(n).syncRemotes(ctx, remote, func(a netip.Addr) bool { return a == r.Addr })
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// withdraw removes r's veth and forwarding entries from every node, best
// effort: entries that are not there are the normal case.
func (j *JobNet) withdraw(ctx context.Context, r Rank) {
	for _, n := range j.Nodes {
		if !NetnsExists(n.Name) {
			continue
		}
		nv := j.on(n)
		if nv.hasLink(ctx, r.Veth) {
			_ = nv.ip(ctx, "link", "del", r.Veth)
		}
		_ = nv.syncRemotes(ctx, nil, func(a netip.Addr) bool { return a == r.Addr })
	}
}

// linkExistsIn reports whether the named netns (the current one when "")
// has a link called name.
func linkExistsIn(ctx context.Context, netns, name string) bool {
	r, err := openRTNL(netns)
	if err != nil {
		return false
	}
	defer r.Close()
	return r.hasLink(name)
}
