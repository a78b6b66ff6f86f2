package coord

import (
	"context"
	"net/netip"
	"slices"
	"sort"
	"strings"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/cpufeat"
)

// Placement: where a job's ranks go, and the job's network.

// place puts n ranks on the given candidate nodes (all live nodes if
// none), least loaded first, at most perNode on each (0: as evenly as
// possible). prefer, if set, names a node to keep for a rank when it is a
// candidate.
func place(n, perNode int, cands []coordv1.Node, prefer []string) ([]string, error) {
	if len(cands) == 0 {
		return nil, apiErr(coordv1.CodeNoNodes, "no live node to place %d ranks on", n)
	}
	if perNode <= 0 {
		perNode = (n + len(cands) - 1) / len(cands)
	}
	if perNode*len(cands) < n {
		return nil, apiErr(coordv1.CodeNoNodes, "%d ranks do not fit on %d nodes with at most %d per node", n, len(cands), perNode)
	}
	load := map[string]int{}
	ok := map[string]bool{}
	for _, c := range cands {
		load[c.Name] = c.Ranks
		ok[c.Name] = true
	}
	count := map[string]int{}
	out := make([]string, n)
	for r := range n {
		if r < len(prefer) && ok[prefer[r]] && count[prefer[r]] < perNode {
			out[r] = prefer[r]
			count[prefer[r]]++
		}
	}
	for r := range n {
		if out[r] != "" {
			continue
		}
		best, bestSpare := "", false
		for _, c := range cands {
			if count[c.Name] >= perNode {
				continue
			}
			l, bl := load[c.Name]+count[c.Name], load[best]+count[best]
			// Least loaded first; among equals, a spare (kept for this).
			if best == "" || l < bl || l == bl && c.Spare && !bestSpare {
				best, bestSpare = c.Name, c.Spare
			}
		}
		out[r] = best
		count[best]++
	}
	return out, nil
}

// cpuOf is every CPU feature of the nodes of placement, among nodes.
func cpuOf(nodes []coordv1.Node, placement []string) []string {
	var sets [][]string
	for _, n := range nodes {
		if slices.Contains(placement, n.Name) {
			sets = append(sets, n.CPU)
		}
	}
	return cpufeat.Union(sets...)
}

// withCPU keeps the nodes among cands that have every CPU feature of j
// (those its ranks started on). None left, it says which features the
// others lack.
func withCPU(j *coordv1.Job, cands []coordv1.Node) ([]coordv1.Node, error) {
	out := slices.DeleteFunc(slices.Clone(cands), func(n coordv1.Node) bool { return len(cpufeat.Missing(j.CPU, n.CPU)) > 0 })
	if len(out) == 0 && len(cands) > 0 {
		return nil, apiErr(coordv1.CodeNoNodes, "no candidate node has the CPU features job %s's ranks started with: %s", j.Name, lacking(j, cands))
	}
	return out, nil
}

// checkCPU refuses a placement on a node that lacks a CPU feature of j.
func checkCPU(j *coordv1.Job, nodes []coordv1.Node, placement []string) error {
	for _, n := range nodes {
		if !slices.Contains(placement, n.Name) {
			continue
		}
		if miss := cpufeat.Missing(j.CPU, n.CPU); len(miss) > 0 {
			return apiErr(coordv1.CodeNoNodes, "node %s lacks CPU features job %s's ranks started with (%s): its processes would die of SIGILL there",
				n.Name, j.Name, strings.Join(miss, " "))
		}
	}
	return nil
}

// lacking says, node by node, which of j's CPU features each of nodes
// lacks (those that lack none are not named).
func lacking(j *coordv1.Job, nodes []coordv1.Node) string {
	var parts []string
	for _, n := range nodes {
		if miss := cpufeat.Missing(j.CPU, n.CPU); len(miss) > 0 {
			parts = append(parts, n.Name+" lacks "+strings.Join(miss, " "))
		}
	}
	return strings.Join(parts, "; ")
}

// candidates returns the live nodes among names (all live nodes if none,
// spares only if withSpares), sorted by name; a named node that is not
// alive is an error.
func (rc *records) candidates(ctx context.Context, names []string, withSpares bool) ([]coordv1.Node, error) {
	live, err := rc.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []coordv1.Node
	if len(names) == 0 {
		for _, n := range live {
			if n.Spare && !withSpares || n.Drained {
				continue
			}
			out = append(out, n)
		}
	} else {
		for _, name := range names {
			n, ok := live[name]
			if !ok {
				return nil, apiErr(coordv1.CodeNodeDead, "node %s is not a live node of the cluster", name)
			}
			out = append(out, n)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

// MaxRanks is the most ranks a job may have. Its checkpoint record holds
// every rank and is written to etcd whole: about 110 bytes a rank, 1.1 MB
// at 10,000 ranks (BenchmarkRoundScale), under etcd's 1.5 MiB request
// limit; beyond, the ranks' part of the record would need keys of its own.
const MaxRanks = 10000

// allocNet gives a new job a VNI and a subnet of the job subnets with room
// for ranks addresses beside the network's, the first host's (kept free)
// and the broadcast address: a /24, or a larger block of /24s (aligned on
// its size) for a job of more than 253 ranks.
func (rc *records) allocNet(ctx context.Context, ranks int) (uint32, netip.Prefix, error) {
	c := rc.c
	vni, err := rc.allocVNI(ctx)
	if err != nil {
		return 0, netip.Prefix{}, err
	}
	// A job restarted from the durable tier kept its subnet, which the
	// counter knows nothing of: blocks that overlap a job's are skipped.
	jobs, err := c.Jobs(ctx)
	if err != nil {
		return 0, netip.Prefix{}, err
	}
	bits := 24
	for 1<<(32-bits) < ranks+3 {
		bits--
	}
	blocks := uint32(1) << (24 - bits) // /24s in the job's subnet
	base := c.opts.JobSubnets.Masked()
	if base.Bits() > bits {
		return 0, netip.Prefix{}, apiErr(agentv1.CodeBadRequest, "%d ranks need a /%d: the job subnets %s are smaller", ranks, bits, base)
	}
	// counters/subnet counts the /24s given out; a job's block starts at
	// the next multiple of its size. Clusters from before jobs could be
	// larger than a /24 gave one /24 per VNI.
	var used, start uint32
	prefixAt := func(start uint32) netip.Prefix {
		idx := start % (uint32(1) << (24 - base.Bits()))
		b := base.Addr().As4()
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		v += idx << 8
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), 0}), bits)
	}
	taken := func(p netip.Prefix) bool {
		for _, j := range jobs {
			if o, err := netip.ParsePrefix(j.Subnet); err == nil && o.Overlaps(p) {
				return true
			}
		}
		return false
	}
	take := func() {
		for range uint32(1) << (24 - base.Bits()) {
			start = (used + blocks - 1) / blocks * blocks
			used = start + blocks
			if !taken(prefixAt(start)) {
				return
			}
		}
	}
	if err := rc.advance(ctx, "counters/subnet", &used, take, func() { used = vni - 1; take() }); err != nil {
		return 0, netip.Prefix{}, err
	}
	return vni, prefixAt(start), nil
}

// allocVNI gives out the next job network identifier.
func (rc *records) allocVNI(ctx context.Context) (uint32, error) {
	var vni uint32
	err := rc.advance(ctx, "counters/vni", &vni, func() { vni++ }, func() { vni = 1 })
	return vni, err
}

// jobNet is the job network as node sees it under the job's placement.
func jobNet(j *coordv1.Job, node string, underlays map[string]string) agentv1.JobNet {
	n := agentv1.JobNet{Job: j.Name, VNI: j.VNI, Subnet: j.Subnet, Remotes: map[string]string{}}
	for r, on := range j.Placement {
		if on != node && underlays[on] != "" {
			n.Remotes[j.Addrs[r]] = underlays[on]
		}
	}
	return n
}
