// Package chaos measures a job's effective training time ratio (ETTR)
// under injected node failures on the local cluster of `cairn up`, and
// holds it against the checkpoint interval's model (internal/model,
// docs/planning.md "ETTR under failures"). It is what `cairn chaos` and
// `make chaos` run.
//
// A run starts the ring job (`cairn ringapp`, whose result
// ringapp.Expected predicts) with --checkpoint-every auto, one rank a
// node and k ≥ 1 replicas, so that the coordinator restarts it by itself
// after a node loss. From its first protected checkpoint on, the nodes of
// the cluster fail by a seeded Schedule (testbed Node.Fail), each coming
// back a repair time later (testbed Cluster.Revive); at the end every node
// is back, whatever stopped the run, and the job's result is checked.
//
// Vocabulary:
//
//   - A fault is a node failing or coming back (a repair). A failure hits
//     the job when one of its ranks was placed on the node.
//   - The window is the stretch measured: from the job's first progress
//     report after its first protected checkpoint (when failures begin)
//     to its last one counted.
//   - A run of the job is its stretch between two restarts (an
//     incarnation): model.Measure measures each as cairn report does,
//     giving its undisturbed rate r₀ and each round's cost.
//   - Useful time is the work kept over the window (rank 0's count of
//     messages at its end, less at its start) at r₀: the wall time the
//     same work takes with neither failures nor checkpoints. The ETTR is
//     useful time over the window's wall time.
//   - C is a checkpoint's cost, R a restart's (from the failure until the
//     job is back where its checkpoint left it, at r₀), M the job's mean
//     time between failures (the window over the failures that hit it),
//     τ + C the time between the starts of two rounds: the model's
//     figures, measured in the run. Predict is the model's ETTR for them.
//
// Schedule, Measure and Predict are pure; Run does the I/O.
package chaos
