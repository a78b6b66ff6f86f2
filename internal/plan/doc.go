// Package plan answers the planning questions of replication: with n
// nodes, every node's checkpoint images copied to k other nodes placed in a
// given way, what is the probability that a job using all n nodes can
// restart after f simultaneous node failures (chosen uniformly at random),
// how many failures can it survive with 90/99/99.9% probability, and what k
// does a target need.
//
// A restart is possible iff every node's images survive: the node itself,
// or one of its k replica holders, is alive. (The ranks of a node share
// their node's placement, so the question is per node.)
//
// Placements:
//   - random: each node picks its k holders uniformly among the other n-1
//     nodes, independently (the published design's choice).
//   - ring: node i's holders are i+1 .. i+k (mod n).
//   - pairs: nodes form groups of k+1 (pairs when k = 1) and hold each
//     other's images; a remainder joins the last group, inside which nodes
//     use the ring rule.
//
// All three are computed exactly (Exact): random by a closed form (the
// holder sets are independent, so P = (1 - C(f-1,k)/C(n-1,k))^f), ring and
// pairs by dynamic programming over the nodes with the failures drawn
// sequentially (a node fails with probability r/m when r of the remaining
// m nodes must fail), which stays exact in float64 for n in the thousands.
// MonteCarlo estimates the same probability by simulation, with a Wilson
// score interval, and cross-checks the exact values in tests.
package plan
