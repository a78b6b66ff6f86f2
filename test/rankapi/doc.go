// Package rankapi tests the rank API end to end (docs/rank-api.md):
// programs in C and Python ask for a checkpoint of their own job from
// inside its ranks, ranks are told before checkpoints and after restores,
// and application-level jobs are checkpointed with no CRIU at all.
package rankapi
