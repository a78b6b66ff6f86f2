// Package slurm tests cairn under a real Slurm (Debian's slurm-wlm, a
// slurmd per network-namespace node on this machine, testutil.NewSlurm):
// a job submitted with sbatch and deploy/slurm/cairn.sbatch is signalled
// before its time limit, stopped at a checkpoint, flushed to the durable
// tier, requeued, and restarted from the tier in its next allocation,
// across three allocations, to an exact result; and preempted by a job of a
// higher-priority partition, it finishes in its next allocation. About two
// minutes and a half: in make test, and alone in make slurm.
package slurm
