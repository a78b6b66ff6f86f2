// Package failover tests end to end what becomes of a job and its copies
// when nodes and disks fail: nodes lost with their data, the job restarted
// by itself from the replicas and the copies made again; damaged chunks
// found before CRIU runs and mended from another copy; a node dying while
// it receives a replica; a damaged pack quarantined.
package failover
