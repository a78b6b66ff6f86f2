// Package ranktest is a fake of the rank endpoint a node's agent serves in
// every rank's container (docs/rank-api.md), for testing the rank API's
// clients: the Go one (package rankclient), libcairn and the Python module.
//
// A Server listens on a unix socket for one rank of one job and speaks the
// protocol of api/rank/v1 as the spec has it: info; checkpoint and result,
// a round going pending, then (after its prepare) frozen with the socket
// removed and every connection closed, then done, aborted, or restored
// into a new incarnation; event with the job's rate limit; watch with its
// prepare event and ready. What a round ends in is scripted: by Next for
// the checkpoints the rank asks for, by Checkpoint for one the rank did
// not ask for (cairn's --checkpoint-every, a migration). LoseReply closes
// a request's connection after carrying it out, as a quiesce may: a
// client that sends it again with its id gets the first reply.
//
// Trace records what happened, in order, for tests to assert sequences.
package ranktest
