// Package netw builds the networks rank containers live in.
//
// Nouns:
//   - bridge: a Linux bridge on a node that rank containers attach to; it
//     holds the subnet's gateway address.
//   - netns: a named network namespace (bind-mounted under /run/netns) that
//     cairn creates and owns for each container, so that the same namespace
//     can be re-created empty with the same addresses before a CRIU restore.
//     runc joins it by path.
//   - veth: the pair joining a netns (as eth0) to the bridge.
//   - IPAM: the allocation of addresses in a subnet, kept in a file under the
//     data dir and changed under a file lock.
//   - guard: an nftables table in a namespace that refuses whatever
//     arrives on a bridge for the namespace itself (Guard,
//     Bridge.EnsureGuarded), so containers reach no listener of their
//     host while forwarded traffic passes.
//   - node: on one machine, a cluster node is a named netns joined to an
//     underlay bridge that plays the physical network (Node, Cluster:
//     what `cairn up` builds).
//   - job network: a job's private layer-2 network over VXLAN, built from
//     the host for a whole cluster by JobNet, or on one node by that node's
//     agent with NodeJobNet (its remote ranks' forwarding entries:
//     SetRemotes).
//   - lock: a netns that drops all traffic but loopback (LockNetns), for the
//     length of a global checkpoint or restore. CRIU has a network lock of
//     its own, which a CRIU killed mid-dump leaves behind (DropCRIULock).
//
// The package drives iproute2 (`ip`, `bridge`) rather than netlink
// directly: the commands are the ones an operator would type to inspect or
// repair the state, and they are cheap next to a checkpoint. The lock is the
// exception: it sits on the checkpoint's critical path, once per rank, so it
// talks nftables netlink itself in well under a millisecond.
package netw
