// Package testbed runs a whole cairn cluster on one machine, the local
// cluster of `cairn up`: a coordinator on the host and N agents, each in a
// network namespace of its own (a node, with its own data dir and
// bridges), joined by veths to a host bridge that plays the physical
// network, every credential signed by a fresh CA. It is what `cairn up`,
// `cairn down` and `cairn node fail`, the demos and the end-to-end tests
// (internal/testutil) use.
//
// The name: a testbed is a full installation of a system on a bench, built
// to try it out, show it and break it on purpose, which is what this
// cluster is for; "local cluster" is how the CLI speaks of it.
//
// Node.Fail stops a node as a machine that dies does; Cluster.Revive
// brings it back as one that is repaired and boots again (`cairn node
// fail`, `cairn node revive`, and the failures of `cairn chaos`).
//
// Cluster is the record of a testbed, kept in DIR/cluster.json (DIR is
// DATA/cluster of the data dir `cairn up` ran with): the coordinator's
// address and process, and every node's agent, data dir and staging dir.
// It is the one definition of that file: whoever restarts one of the
// cluster's processes records it there (Save), so that Down stops it.
//
// The coordinator and the agents run as processes of the cairn binary
// (Config.Exe), started detached: the testbed outlives the command that
// made it. The package links neither the coordinator nor the agent.
package testbed
