package v1

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Paths of the agent API.
const (
	PathHealth      = "/v1/health"      // GET: Health
	PathContainers  = "/v1/containers"  // GET: []Container; POST RunRequest: Container
	PathContainer   = "/v1/containers/" // + NAME: GET Container; DELETE (?force=1)
	PathCheckpoint  = "/v1/checkpoint"  // POST CheckpointRequest: Checkpoint
	PathRestore     = "/v1/restore"     // POST RestoreRequest: Container
	PathCheckpoints = "/v1/checkpoints" // GET ?container=NAME: []Checkpoint
)

// Error codes.
const (
	CodeNotFound     = "not_found"
	CodeExists       = "exists"
	CodeRunning      = "running"
	CodeNotRunning   = "not_running"
	CodeCorrupt      = "corrupt"
	CodeBadRequest   = "bad_request"
	CodeForbidden    = "forbidden"
	CodeCRIU         = "criu_unusable"
	CodeDumpFailed   = "dump_failed"
	CodeDamaged      = "damaged" // a dump died half-way and left the container's processes unusable
	CodeInternal     = "internal"
	CodeUnauthorized = "unauthenticated"
	// CodeTierUnreachable: the durable tier (an object store, a shared
	// file system) did not answer; nothing was changed by the request.
	CodeTierUnreachable = "tier_unreachable"
	// CodeStaleTerm: the calling coordinator's term is older than one
	// that has already called this agent: a newer coordinator leads, and
	// the old one may no longer act (see TermHeader).
	CodeStaleTerm = "stale_term"
)

// TermHeader carries the term of the coordinator that makes a call
// (Term.String). An agent refuses a coordinator's call whose term is
// older than the newest it has seen from the same catalog
// (CodeStaleTerm, HTTP 409), so a coordinator that was replaced but still
// runs (paused, cut off, started twice by mistake) can never act on a
// job again.
const TermHeader = "X-Cairn-Term"

// Term is a coordinator's term: a number its catalog gives each
// coordinator as it starts, larger than every earlier one's, and the
// catalog's own random id, made with its first term. A term of another
// catalog (one made anew after the old one was lost) is not older: it
// starts the count again.
type Term struct {
	N       uint64
	Catalog string
}

// String is the term as TermHeader carries it: N/CATALOG.
func (t Term) String() string { return strconv.FormatUint(t.N, 10) + "/" + t.Catalog }

// ParseTerm reads a Term's String.
func ParseTerm(s string) (Term, error) {
	n, cat, ok := strings.Cut(s, "/")
	v, err := strconv.ParseUint(n, 10, 64)
	if !ok || err != nil || cat == "" || len(cat) > 64 {
		return Term{}, fmt.Errorf("%q is not a coordinator term (N/CATALOG)", s)
	}
	return Term{N: v, Catalog: cat}, nil
}

// Older reports whether t is older than u: of the same catalog, with a
// smaller number.
func (t Term) Older(u Term) bool { return t.Catalog == u.Catalog && t.N < u.N }

// Error is the body of every non-2xx reply.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Message
}

// Health says who answers.
type Health struct {
	Node      string `json:"node"`
	Cluster   string `json:"cluster"`
	Version   string `json:"version"` // API version, "v1"
	CRIU      string `json:"criu,omitempty"`
	CRIUError string `json:"criu_error,omitempty"`
}

// RunRequest starts a container.
type RunRequest struct {
	Name     string   `json:"name"`
	Args     []string `json:"args"`
	Env      []string `json:"env,omitempty"`
	RootFS   string   `json:"rootfs,omitempty"`
	Hostname string   `json:"hostname,omitempty"`
	Cwd      string   `json:"cwd,omitempty"`
}

// Status is what a container is doing, as the node's container manager
// derives it (its values are those of internal/container.Status).
type Status string

// The statuses of a container.
const (
	StatusCreated      Status = "created"      // its init is made, the command not started yet
	StatusRunning      Status = "running"      // its processes run
	StatusPaused       Status = "paused"       // its processes are frozen
	StatusStopped      Status = "stopped"      // nothing runs and no exit was recorded
	StatusExiting      Status = "exiting"      // its init has ended; its last output and exit are being recorded
	StatusExited       Status = "exited"       // its init has ended; ExitCode says how
	StatusCheckpointed Status = "checkpointed" // a checkpoint with Stop ended it
)

// Live reports whether the container's init is there, running or not:
// created, running or paused.
func (s Status) Live() bool {
	return s == StatusCreated || s == StatusRunning || s == StatusPaused
}

// Active reports whether the container has not ended yet: it is live, or
// exiting (its last output and its exit are still being recorded).
func (s Status) Active() bool { return s.Live() || s == StatusExiting }

// Container is a container's state.
type Container struct {
	Name         string    `json:"name"`
	Status       Status    `json:"status"`
	Pid          int       `json:"pid,omitempty"`
	Addr         string    `json:"addr"`
	Args         []string  `json:"args"`
	Created      time.Time `json:"created"`
	RestoredFrom string    `json:"restored_from,omitempty"`
	ExitCode     *int      `json:"exit_code,omitempty"`
	// EndedBy says why the node ended the container, if it did rather
	// than its program (its lazy restore's pages could not be fetched):
	// a failure of the node's, which the job's failure policy handles.
	EndedBy string `json:"ended_by,omitempty"`
	// Holders, in the reply to a RankRestore from the stream only: what
	// each holder sent, and which served damage (to be repaired).
	Holders []HolderShare `json:"holders,omitempty"`
}

// CheckpointRequest checkpoints a container.
type CheckpointRequest struct {
	Name string `json:"name"`
	Stop bool   `json:"stop,omitempty"`
}

// Checkpoint describes one checkpoint of a container.
type Checkpoint struct {
	Container string          `json:"container"`
	Seq       int             `json:"seq"`
	Created   time.Time       `json:"created"`
	Size      int64           `json:"size"`
	NewBytes  int64           `json:"new_bytes"`
	Stall     time.Duration   `json:"stall_ns"`
	Total     time.Duration   `json:"total_ns"`
	Pinned    bool            `json:"pinned"`
	Record    json.RawMessage `json:"record,omitempty"` // the full catalog record
}

// RestoreRequest restores a container from a checkpoint.
type RestoreRequest struct {
	Name string `json:"name"`
	Seq  int    `json:"seq,omitempty"` // 0: newest
	As   string `json:"as,omitempty"`
}
