// Package coord is the coordinator: it keeps the cluster's catalog (nodes,
// jobs, global checkpoints) in etcd through package catalog, places ranks,
// and drives the protocols over the agents' API: job start, the two-phase
// commit of a global checkpoint (whose decisions package coord/round makes),
// whole-job restart, replication of rank images to peer nodes, and the
// automatic restart of jobs that lose a node. It serves the coordinator API
// (api/coord/v1) to agents and the CLI.
//
// Catalog layout (keys under catalog's root):
//
//	nodes/NAME          v1.Node (without the live fields)
//	alive/NAME          membership, on a lease kept by the node's heartbeats
//	jobs/NAME           v1.Job
//	ckpts/JOB/SEQ       v1.Ckpt (SEQ zero-padded, so keys sort by number),
//	                    with the nodes holding a copy of each rank image
//	counters/vni        the last VNI given to a job
//
// Every change to a job or a checkpoint record is a compare-and-swap on its
// key; the commit point of a round is the one transaction that moves its
// record from preparing to committed.
package coord
