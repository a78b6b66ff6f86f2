// Package v1 is version 1 of the cluster's event stream: the typed events
// the coordinator publishes about everything that happens to nodes, jobs,
// checkpoints, replicas and migrations, as served by the coordinator API
// (GET /v1/events, one JSON Event per line) and handed to hooks. Fields
// and types are only ever added within v1.
//
// This package imports nothing from cairn's internal packages.
package v1

import (
	"strings"
	"time"
)

// Event is one thing that happened in the cluster. Seq orders all events
// of a coordinator's history; the optional fields say what it concerns.
type Event struct {
	Seq      uint64        `json:"seq"`
	Time     time.Time     `json:"time"`
	Type     string        `json:"type"`
	Job      string        `json:"job,omitempty"`
	Node     string        `json:"node,omitempty"`
	Rank     *int          `json:"rank,omitempty"`
	Ckpt     int           `json:"ckpt,omitempty"`
	Peer     string        `json:"peer,omitempty"` // the other node (replication, migration)
	Duration time.Duration `json:"duration_ns,omitempty"`
	Bytes    int64         `json:"bytes,omitempty"`
	Kind     string        `json:"kind,omitempty"` // a rank's event: what kind, as the rank names it
	Message  string        `json:"message,omitempty"`
}

// Event types.
const (
	NodeJoined    = "node.joined"
	NodeLost      = "node.lost"
	NodeDrained   = "node.drained"
	NodeUndrained = "node.undrained"

	HealthWarning = "health.warning" // a node's health probe went bad (Message says which)
	HealthOK      = "health.ok"      // it is good again

	// StoreQuarantined: a node's store found a damaged pack and set it
	// aside in its quarantine/, salvaging what still verified (Message
	// says which pack and how many blobs were salvaged and lost).
	StoreQuarantined = "store.quarantined"

	JobStarted       = "job.started"
	JobRestarting    = "job.restarting"
	JobRestarted     = "job.restarted"
	JobRestartFailed = "job.restart_failed"
	JobLost          = "job.lost" // a node died and the policy is stop
	// JobExited: every rank of the job exited 0. JobFailed: a rank ended
	// otherwise (Message says how each did), and the job with it.
	JobExited = "job.exited"
	JobFailed = "job.failed"
	// JobStopped: a checkpoint with stop ended every rank at it (Ckpt);
	// cairn restart resumes the job from there.
	JobStopped = "job.stopped"
	// JobInterval: the coordinator chose a new checkpoint interval for a
	// job with an automatic one; Duration is the interval, Message why.
	JobInterval = "job.interval"

	CkptPrepared = "checkpoint.prepared" // every rank dumped; Duration: the prepare phase
	// CkptRemoved: a checkpoint was removed by the job's retention (Keep)
	// or by a user; Message says which and why.
	CkptRemoved = "checkpoint.removed"
	// CkptFlushed: a checkpoint was flushed to the job's durable tier;
	// Bytes were uploaded, Message says where and how much was new.
	CkptFlushed   = "checkpoint.flushed"
	CkptCommitted = "checkpoint.committed"
	CkptAborted   = "checkpoint.aborted"
	CkptDurable   = "checkpoint.durable" // every rank image stored on its node
	CkptProtected = "checkpoint.protected"

	ReplicaCopied   = "replica.copied" // one rank image copied to Node from Peer
	ReplicaFailed   = "replica.failed"
	ReplicaRepaired = "replica.repaired" // a damaged copy on Node repaired from Peer

	// RankEvent: a rank published an event of its own through the rank
	// API (docs/rank-api.md); Kind and Message are the rank's.
	RankEvent = "rank.event"

	MigrationStarted  = "migration.started"  // Node: source, Peer: target
	MigrationStalled  = "migration.stalled"  // every rank frozen, network locked, the rank dumped
	MigrationMoved    = "migration.moved"    // the image is on the target; Bytes moved
	MigrationRestored = "migration.restored" // the rank restored on the target, frozen
	MigrationDone     = "migration.done"     // every rank resumed; Duration: the whole stall
	MigrationFailed   = "migration.failed"   // the job resumed where it was

	HookFailed = "hook.failed" // a hook gave up on an event (Message says why)
)

// Match reports whether an event type matches a pattern: the type itself,
// "*" for every type, or "prefix.*" for a family ("checkpoint.*").
func Match(pattern, typ string) bool {
	switch {
	case pattern == "*" || pattern == typ:
		return true
	case strings.HasSuffix(pattern, ".*"):
		return strings.HasPrefix(typ, strings.TrimSuffix(pattern, "*"))
	}
	return false
}

// IntPtr is a helper for Event.Rank.
func IntPtr(i int) *int { return &i }
