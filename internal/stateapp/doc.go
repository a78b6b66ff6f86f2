// Package stateapp is a small stateful program used by cairn's demo, tests
// and benchmarks to show that a checkpoint captures everything: it keeps a
// counter in memory, appends every count to a file in its root, and streams
// checksummed, sequence-numbered messages over a TCP connection between two
// of its processes, where the receiver checks that nothing is lost,
// duplicated or corrupted. Optionally it holds a buffer of dirty memory.
//
// It runs as `cairn stateapp` inside a container. Output lines (stdout):
//
//	count=N                 every 50 counts (sender)
//	recv=N bytes=B          about every 100 ms (receiver)
//	FAIL <reason>           the receiver saw a bad message; it exits 3
package stateapp
