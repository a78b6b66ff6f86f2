// Package tier tests the durable tier end to end: a job's checkpoints
// flushed from one cluster, and the job restarted from the tier alone on
// a fresh cluster (new nodes, data dirs and CA), as in a new allocation;
// damaged and missing objects refused with the documented exit codes.
package tier
