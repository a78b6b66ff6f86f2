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
//   - job network: a job's private layer-2 network over VXLAN, built from
//     the host for a whole cluster by JobNet, or on one node by that node's
//     agent with NodeJobNet.
//   - lock: a netns that drops all traffic but loopback (LockNetns), for the
//     length of a global checkpoint or restore.
//
// The package drives iproute2 (`ip`, `bridge`) rather than netlink
// directly: the commands are the ones an operator would type to inspect or
// repair the state, and they are cheap next to a checkpoint. The lock is the
// exception: it sits on the checkpoint's critical path, once per rank, so it
// talks nftables netlink itself in well under a millisecond.
package netw
