// Package v1 is version 1 of the rank API: what a rank and its node's
// agent say to each other over the unix socket in the rank's container
// (docs/rank-api.md). A message is one JSON object on one line.
//
// This package imports nothing from cairn's internal packages.
package v1

// SocketPath is where the socket is in every rank's container; EnvSocket
// names the environment variable that holds the same path, and
// EnvRestart the one that tells a rank of an application-level job,
// started afresh on its restored files, which checkpoint they are from.
const (
	SocketDir  = "/run/cairn"
	SocketPath = SocketDir + "/rank.sock"
	EnvSocket  = "CAIRN_SOCKET"
	EnvRestart = "CAIRN_RESTART"
)

// MaxLine is the longest message, newline included.
const MaxLine = 64 << 10

// Operations.
const (
	OpInfo       = "info"
	OpCheckpoint = "checkpoint"
	OpResult     = "result"
	OpEvent      = "event"
	OpWatch      = "watch"
	OpReady      = "ready"
)

// Modes of a job.
const (
	ModeTransparent = "transparent" // CRIU dumps every rank (the default)
	ModeApp         = "app"         // every rank saves its own state when told
)

// Request is a message from a rank.
type Request struct {
	Op string `json:"op"`
	// ID (checkpoint, event), if set, names the request: 1 to MaxID
	// letters, digits, '-' or '_', new for every call. One sent again with
	// the same ID, because its connection closed before the reply, is not
	// carried out again: the endpoint answers with the first reply
	// (Replies).
	ID string `json:"id,omitempty"`
	// Job and Rank, if set, must be the caller's own.
	Job  string `json:"job,omitempty"`
	Rank *int   `json:"rank,omitempty"`
	// Stop (checkpoint): stop the job once the checkpoint is durable.
	Stop bool `json:"stop,omitempty"`
	// Ticket (result): what checkpoint asked for.
	Ticket string `json:"ticket,omitempty"`
	// Kind and Message (event).
	Kind    string `json:"kind,omitempty"`
	Message string `json:"message,omitempty"`
	// Prepare and DeadlineMS (watch): be told before checkpoints, and
	// have that long to answer ready.
	Prepare    bool `json:"prepare,omitempty"`
	DeadlineMS int  `json:"deadline_ms,omitempty"`
}

// Reply is the agent's answer to a Request.
type Reply struct {
	OK    bool   `json:"ok"`
	Code  string `json:"code,omitempty"`
	Error string `json:"error,omitempty"`

	// info and watch
	Job          string `json:"job,omitempty"`
	Rank         *int   `json:"rank,omitempty"`
	Size         int    `json:"size,omitempty"`
	Mode         string `json:"mode,omitempty"`
	Ckpt         int    `json:"ckpt,omitempty"`
	Restored     bool   `json:"restored,omitempty"`
	RestoredFrom int    `json:"restored_from,omitempty"`
	Incarnation  int    `json:"incarnation,omitempty"`

	// checkpoint and result
	Ticket string `json:"ticket,omitempty"`
	State  string `json:"state,omitempty"`
}

// Result states.
const (
	StatePending  = "pending"
	StateDone     = "done"
	StateFailed   = "failed"
	StateRestored = "restored"
)

// Error codes.
const (
	CodeBadRequest  = "bad_request"
	CodeForbidden   = "forbidden"
	CodeNotFound    = "not_found"
	CodeRateLimited = "rate_limited"
	CodeUnavailable = "unavailable"
	CodeAborted     = "aborted"
	CodeConflict    = "conflict"
)

// Event is what the agent sends on a watch connection: Prepare before a
// checkpoint freezes the rank (answer with a Request of Op ready within
// DeadlineMS).
type Event struct {
	Event      string `json:"event"`
	Ckpt       int    `json:"ckpt,omitempty"`
	Mode       string `json:"mode,omitempty"`
	DeadlineMS int    `json:"deadline_ms,omitempty"`
}

// EventPrepare is the only Event.
const EventPrepare = "prepare"

// MaxKind and MaxMessage bound an event's kind and message.
const (
	MaxKind    = 32
	MaxMessage = 1024
)

// KindProgress is the kind of event by which a rank tells how far its
// job has come: the message is a decimal count of the job's units of
// work done so far (messages, steps, iterations), which only grows while
// the rank runs. `cairn report` measures the job's rate from it, and how
// much checkpoints and replication slow it (docs/planning.md, "The
// overhead of a job").
const KindProgress = "progress"
