// Package demo holds cairn's scripted demos, what `cairn demo` and `cairn
// demo cluster` (make demo) run: each step says what it does, and checks
// what it promises, and a failed check ends the demo with an error.
//
// RunContainer runs a stateful program in one container on this node,
// checkpoints it, kills it, tampers with its files and restores it, with
// a Manager of its own on a data dir and bridge of its own. RunCluster
// starts a testbed of 4 nodes and runs a 4-rank ring job through global
// checkpoints, a restart on other nodes, a drain and a node failure;
// every step is a cairn command of the binary (Config.Exe), printed
// before it runs.
package demo
