// Package test holds cairn's end-to-end scenarios, one package a concern:
// a local cluster made by `cairn up` (a coordinator and agents in network
// namespaces), real runc and CRIU, driven through the cairn binary as a
// user would. The tests need root; each one builds its own cluster with
// names, subnets and dirs of its own and checks that nothing of it is left
// afterwards, so the packages run side by side, each test of a package
// after the other. What they share is in internal/testutil.
//
//   - ckpt: global checkpoint rounds, periodic checkpoints, whole-job
//     restarts, aborted rounds, the coordinator dying in the middle of a
//     round, a restart or a job's start;
//   - failover: nodes lost with their disks, automatic restarts from the
//     replicas and the repair of the copies; damaged copies, a node dying
//     mid-replication, quarantined packs;
//   - restore: restarts that fetch a rank's image from its holders, at once
//     or lazily, a holder dying midway;
//   - migrate: rank migrations, their failures, the coordinator dying
//     mid-migration;
//   - faults: a node's agent killed at a failpoint of a protocol step
//     (a commit, a restart's restore, a migration's dump) and started
//     again: the job settles by itself and ends exact;
//   - mpi: Open MPI and MPICH jobs, and an unmodified mpi4py application;
//     with CAIRN_SOAK=1, 16-rank jobs through 100 checkpoint, kill and
//     restart cycles and 20 migrations, and a 64-rank job;
//   - rankapi: the rank API from C and Python, callbacks, application-level
//     checkpoints;
//   - ops: what operators use: the CLI, logs, events and hooks, health
//     probes, metrics, the dashboard, reports, rank isolation;
//   - control: three coordinators, the leader killed, paused or cut off
//     from etcd mid-protocol: a standby takes over, the old one is fenced;
//   - chaos: cairn chaos, the ring job while nodes fail at random and
//     come back, its ETTR against the model's, a run interrupted;
//   - conform: the agent's conformance suite against real agents, served
//     in the test process rather than through the binary, each node a
//     network namespace.
package test
