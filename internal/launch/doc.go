// Package launch starts unmodified MPI jobs across a job's rank
// containers, so that every process of the job descends from its rank
// container's init and is therefore in the rank's checkpoint.
//
// Nouns:
//
//   - The launch daemon is the init of every rank container of an MPI job
//     (`cairn rankinit`). It writes /etc/hosts (localhost, this rank, the
//     job's ranks by IP), listens on the rank's job address (port Port),
//     and runs the commands authenticated peers of the same job ask for as
//     its own children, relaying their stdin, stdout, stderr, signals and
//     exit status. In rank 0 it also starts the job's launcher
//     (Open MPI's mpirun or MPICH's hydra mpiexec) as its child, and tells
//     the others to end when the launcher ends.
//   - The agent (`cairn rsh HOST CMD...`) is what the launcher runs, as
//     it would run ssh, to start its daemons (orted, hydra_pmi_proxy) in the
//     other ranks: it connects to HOST's launch daemon and behaves like an
//     rsh session there.
//   - The secret is a per-job key every rank gets in its environment
//     (EnvSecret). A daemon answers only connections from the job's own
//     rank addresses that prove they hold it (HMAC-SHA256 over a fresh
//     nonce), so a rank reaches nothing of another job, and nobody outside
//     the job reaches its daemons.
//
// ExportEnv picks what of its caller's environment a job gets, MPI or
// not, as srun --export does (cairn run --job --export).
//
// The wire protocol is in wire.go; docs/mpi.md says how a job is launched,
// which MCA and hydra settings cairn applies and why.
package launch
