// Package catalog keeps the cluster's catalog, the coordinator's durable
// state (nodes, jobs, checkpoints), in etcd, and tells which members are
// alive. By default etcd runs inside the coordinator's process
// ([StartEmbedded]); [Open] connects to it, or to any etcd cluster.
//
// The package knows nothing of nodes, jobs or checkpoints: it stores JSON
// values under keys, and the coordinator defines its records on top.
//
// # Keys
//
// Every key is relative to [Root] ("/cairn/") and slash-separated, like a
// path: "jobs/train-7", not "/jobs/train-7". A prefix selects the keys
// that start with it, byte for byte, so a prefix meant as a directory
// ends with '/': "jobs/" does not match "jobsets/x", "jobs" does. The
// coordinator's layout is:
//
//	nodes/NODE          a node's record
//	jobs/JOB            a job's record
//	ckpts/JOB/SEQ       a checkpoint (ckpt) of JOB; SEQ is zero-padded so
//	                    that key order is checkpoint order
//	migrations/JOB/SEQ  a migration of one of JOB's ranks
//	counters/NAME       what was given out so far (VNIs, job subnets)
//	alive/NAME          a member's liveness key, attached to its lease
//
// alive/ belongs to this package ([Catalog.Register]); the others are
// conventions of the coordinator.
//
// # Revisions and concurrency
//
// etcd numbers every write with a cluster-wide revision. [Catalog.Get]
// returns a key's mod revision, the revision of the write that last
// changed it. [Catalog.Txn] writes several keys atomically on condition
// that keys are still at the revisions read ([IfRevision], [IfAbsent]),
// and fails with [ErrConflict] otherwise: that is how a decision, such as
// committing a checkpoint rather than aborting it, is taken exactly once.
// [Catalog.Update] is the read-modify-write loop built on it.
// [Catalog.List] reads a consistent snapshot and returns its revision, from
// which [Catalog.Watch] follows every later change, so a follower misses
// nothing between the two. History older than about ten minutes is
// compacted on the embedded server; a watch that starts before that ends
// with [ErrCompacted].
//
// # Membership
//
// A member (a node agent, a coordinator) calls [Catalog.Register] to put
// alive/NAME under a lease of a few seconds, and [Membership.KeepAlive]
// more often than that. When it stops, its lease expires and etcd deletes
// the key: [Catalog.WatchAlive] reports it lost within the TTL plus about
// half a second (etcd checks for expired leases twice a second).
// [Membership.Revoke] reports it lost at once. When etcd restarts, every
// lease starts its TTL afresh, so a member that died while etcd was down
// is reported lost one TTL after etcd is back.
//
// # Embedded etcd
//
// [StartEmbedded] runs a single member tuned to start and stop in well
// under a second: 50 ms heartbeat and 250 ms election timeout (which also
// lets leases as short as 1 s work), snapshots every 10000 writes, periodic
// compaction keeping ten minutes of history, a 256 MiB database quota, and
// its log in the data directory or in the caller's slog.Logger, never on
// stderr. It opens no TCP port: its clients speak plain gRPC through the
// unix socket etcd.sock in its data directory, which is mode 0700 and the
// process's user's own, so no other local user can reach the catalog; and
// as a single member it has no peer listener at all.
//
// An etcd cluster of the operator's is reached with [ExternalConfig]:
// over TLS with a CA and a client certificate, or without TLS only on
// this machine (a unix socket, or http:// to a loopback address).
package catalog
