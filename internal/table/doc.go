// Package table writes the text tables cairn's commands print of its
// objects, one function per kind: the containers and checkpoints of a
// node, the jobs, nodes, checkpoints and migrations of a cluster, its
// events, the answers of the replication planner. A command chooses JSON
// (the objects themselves) or these tables; what a command says of its
// own result stays with the command.
//
// The formats are the CLI's interface for people: columns separated by
// two spaces (New), sizes, durations and times as package human writes
// them, and "-" where there is nothing to show. They are tested here
// without any container or cluster.
package table
