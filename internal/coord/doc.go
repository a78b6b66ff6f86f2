// Package coord is the coordinator: it keeps the cluster's catalog (nodes,
// jobs, global checkpoints, migrations) in etcd through package catalog,
// places ranks, and drives the protocols over the agents' API: job start,
// the two-phase commit of a global checkpoint, whole-job restart, live
// migration, replication of rank images to peer nodes and their repair,
// and the automatic restart of jobs that lose a node. It serves the
// coordinator API (api/coord/v1) to agents and the CLI.
//
// The protocols' decisions are pure state machines (package coord/round
// for the round, coord/machine for the others); this package performs
// their actions (drive.go, jobrun.go) and finishes, at start, what a
// coordinator that died left unfinished (docs/protocols.md). No protocol
// starts another: each reports its outcome to the supervisor
// (supervise.go), which decides what follows by package coord/policy.
// Agents are reached only through the Agent interface: rpc.AgentClient
// over the wire, or package coord/memagent in memory (tests, benchmarks).
//
// Coordinator is the API; each concern behind it is a part of its own
// (records, agents, jobLocks, nodeReports, rounds, jobRuns, migrations,
// replicator, supervisor, ...), in a file of its own.
//
// Catalog layout (keys under catalog's root):
//
//	nodes/NAME            v1.Node (without the live fields)
//	alive/NAME            membership, on a lease kept by the node's heartbeats
//	jobs/NAME             v1.Job
//	ckpts/JOB/SEQ         v1.Ckpt (SEQ zero-padded, so keys sort by number),
//	                      with the nodes holding a copy of each rank image
//	migrations/JOB/SEQ    v1.Migration (its number from the job's sequence)
//	counters/vni          the last VNI given to a job
//	counters/subnet       the /24s of the job subnets given out so far
//	counters/failures     node failures seen, and the node-time watched
//	                      (model.Failures): a node's estimated MTBF
//
// Every change to a job or a checkpoint record is a compare-and-swap on its
// key; the commit point of a round is the one transaction that moves its
// record from preparing to committed, and that of a migration the one that
// places the rank on its target.
package coord
