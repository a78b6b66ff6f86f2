// Package rankclient is the client side of the rank API (api/rank/v1,
// docs/rank-api.md): what a program in a rank's container, and `cairn
// rank`, use to talk to the node's agent over the unix socket in that
// container.
//
// A Client sends one request per connection. While the endpoint is away
// (the socket removed while the rank is frozen for a checkpoint or a
// migration, or a connection closed before its reply) it tries again
// every 50 ms, as the spec asks, until its context ends. Checkpoint waits
// for the checkpoint's outcome and, like fork, returns twice: once after
// the checkpoint, and once more in a rank restored from it. Watch holds a
// watch connection and calls back around checkpoints.
//
// Errors the agent returns are *Error; errors.Is matches them against
// ErrForbidden, ErrAborted and the other sentinels, one per wire code.
//
// libcairn (deploy/libcairn) and the Python module (deploy/python) are
// the same client in C and Python; package ranktest is a fake endpoint
// all three are tested against.
package rankclient
