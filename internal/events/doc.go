// Package events is the cluster's event stream: an Exchange that numbers
// the events the coordinator publishes, keeps a bounded history of them
// (in memory and in a file that survives a coordinator restart), replays
// it to subscribers that come late and delivers new events live; and the
// hooks that run a command or POST to a URL for chosen event types, with
// retries, without ever blocking the publisher. A hook's command runs in a
// process group of its own, killed whole at its timeout (package proc); a
// POST may go to an https:// URL and is signed with an HMAC of its body
// when a secret is shared with the receiver (Sign, Verify).
//
// Vocabulary: an event's type is a dotted name from api/events/v1
// ("checkpoint.committed"); a pattern is a type, "family.*" or "*".
package events
