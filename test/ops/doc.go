// Package ops tests end to end what users and operators see of a cluster:
// the CLI's exit codes and srun-like launches, job logs across restarts,
// the event stream and hooks, health probes that migrate a rank, metrics,
// the dashboard in a real browser, `cairn report`, and what a rank cannot
// see or reach.
package ops
