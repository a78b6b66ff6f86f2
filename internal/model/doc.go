// Package model is the arithmetic of a job's overhead and of its
// checkpoint interval (docs/planning.md): no I/O and no clock, only the
// coordinator's records and events as they are.
//
// Vocabulary:
//
//   - A round is one global checkpoint round of a job, as its record has
//     it: when it began, how long its ranks were frozen (the stall), and
//     of that the coordination (t_coord), the containers' own work beyond
//     CRIU (t_cont) and the rest, CRIU writing the images (t_write); then
//     the time after the thaw (the images stored, TCP recovering from the
//     network lock), and the images' copies to other nodes.
//   - A sample is a progress report of a job: a count of its units of
//     work done, at a time (rank events of kind progress).
//   - The terms are those of t_total = t_comp + α·t_comm + n·(t_coord +
//     t_write + t_cont) + t_after, measured by Measure from rounds and
//     samples; Report adds replication, the interval and restart odds.
//   - The cost C of a checkpoint is what it costs the job: its stall,
//     plus its loss after the thaw and while copying when the job
//     reports progress. M is the job's mean time between failures: a
//     node's over the job's nodes.
//   - An interval is the time between the starts of two rounds: Daly's
//     optimal compute time τ plus C (Choose). Expected and Simulate are
//     the run times the interval is held against in the tests.
package model
