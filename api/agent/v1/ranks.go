package v1

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Paths of the job-rank part of the agent API, used by the coordinator.
// A rank's container is named JOB.RANK on its node.
const (
	PathJobNet      = "/v1/jobnet"           // PUT JobNet: ensure the job network on this node; DELETE ?vni=N
	PathRankRun     = "/v1/ranks/run"        // POST RankRun: Container
	PathRankRestore = "/v1/ranks/restore"    // POST RankRestore: Container (restored frozen, network locked)
	PathRankResume  = "/v1/ranks/resume"     // POST RankResume: unlock and thaw
	PathRankRemove  = "/v1/ranks/remove"     // POST RankRemove: kill, remove the container and its network
	PathPrepare     = "/v1/ckpt/prepare"     // POST Prepare: Prepared
	PathCommit      = "/v1/ckpt/commit"      // POST Finish: Committed (once the image is durable)
	PathAbort       = "/v1/ckpt/abort"       // POST Finish
	PathFetch       = "/v1/images/fetch"     // POST Fetch: Image (copies an image from another agent)
	PathExport      = "/v1/images/export"    // GET ?container=NAME&seq=N: an export stream (agents may call it)
	PathChunks      = "/v1/images/chunks"    // GET ?container=NAME&seq=N: Chunks (agents may call it)
	PathExportDelta = "/v1/images/delta"     // POST ExportDelta: a delta export stream (agents may call it)
	PathChunkData   = "/v1/images/chunkdata" // POST ChunkData: a chunk stream (agents may call it)
	PathDropImages  = "/v1/images/drop"      // POST DropImages: Dropped
	PathLogs        = "/v1/logs/"            // + NAME, GET LogQuery: the container's output (its current incarnation's unless N)
	PathKill        = "/v1/kill/"            // + NAME, POST ?signal=N

	// A container's incarnations, whose logs PathLogs serves.
	PathIncarnations = "/v1/incarnations/" // + NAME, GET: []Incarnation, oldest first

	// Migration of one rank (see MigrateIn).
	PathRankStall  = "/v1/ranks/stall"       // POST RankStall: lock and freeze ranks (RankResume ends it)
	PathStaged     = "/v1/images/staged"     // GET ?container=NAME&seq=N[&lazy=1]: a prepared rank's staged image as tar (agents may call it), its size in HeaderStagedSize; lazy: its pages files as holes
	PathMigrateIn  = "/v1/ranks/migrate-in"  // POST MigrateIn: MigratedIn
	PathMigrateOut = "/v1/ranks/migrate-out" // POST MigrateOut: the rank has moved away

	// A post-copy migration's pages, which the target reads from the
	// source (agents may call them).
	PathStagedPages = "/v1/images/staged/pages" // POST StagedPages: the pages, 4 KiB each, in the order asked
	PathStagedDone  = "/v1/images/staged/done"  // POST ImageRef: the target has every page (or gave up): the source drops them
)

// StagedPages asks for pages of a pages file of a staged image: a
// prepared rank's, or one a post-copy migration moved away
// (MigrateOut.Donor). Runs are [first, count] pairs of page indexes in
// the file.
type StagedPages struct {
	ImageRef
	File string     `json:"file"`
	Runs [][2]int64 `json:"runs"`
}

// MaxStagedPages bounds the pages of one StagedPages request.
const MaxStagedPages = 1 << 16

// Incarnation is one run of a container's processes on the node: its
// first run, or a restore. The current incarnation's output starts with
// what its checkpoint kept; an earlier one's is as it was when it ended.
type Incarnation struct {
	N            int       `json:"incarnation"` // numbered on from the incarnation its checkpoint was taken in
	Started      time.Time `json:"started"`
	RestoredFrom string    `json:"restored_from,omitempty"`  // the checkpoint (NAME:SEQ), for a restore
	Restored     int64     `json:"restored_bytes,omitempty"` // the output it started with
	Ended        time.Time `json:"ended,omitzero"`           // when an earlier one ended, if known
	ExitCode     *int      `json:"exit_code,omitempty"`
	Signal       string    `json:"signal,omitempty"`
	Checkpointed bool      `json:"checkpointed,omitempty"` // ended by checkpoint --stop
	Current      bool      `json:"current,omitempty"`
	Bytes        int64     `json:"bytes"` // its output
}

// HeaderStagedSize announces, in the reply to PathStaged, the bytes of
// the files the staged-image stream carries (decimal). The receiver takes
// no more.
const HeaderStagedSize = "Cairn-Staged-Size"

// Node-side error codes of the rank API.
const (
	CodeNoSuchRound = "no_such_round" // commit or abort of a prepare this agent does not hold
)

// JobNet describes a job's network as one node must see it.
type JobNet struct {
	Job    string `json:"job"`
	VNI    uint32 `json:"vni"`
	Subnet string `json:"subnet"` // CIDR
	// Remotes maps the address of every rank NOT on this node to the
	// underlay address of the node it is on.
	Remotes map[string]string `json:"remotes"`
}

// Rank names a rank of a job on this node.
type Rank struct {
	Job  string `json:"job"`
	Rank int    `json:"rank"`
}

// Name is the name of the rank's container on its node: JOB.RANK.
func (r Rank) Name() string { return RankName(r.Job, r.Rank) }

// RankName is the name of rank rank of job's container on its node.
func RankName(job string, rank int) string { return fmt.Sprintf("%s.%d", job, rank) }

// ParseRankName is RankName's inverse; ok is false for a name that is no
// rank's.
func ParseRankName(name string) (job string, rank int, ok bool) {
	i := strings.LastIndexByte(name, '.')
	if i <= 0 {
		return "", 0, false
	}
	rank, err := strconv.Atoi(name[i+1:])
	return name[:i], rank, err == nil && rank >= 0 && strconv.Itoa(rank) == name[i+1:]
}

// RankRun starts a rank.
type RankRun struct {
	Rank
	Net    JobNet   `json:"net"`
	Addr   string   `json:"addr"`
	Args   []string `json:"args"`
	Env    []string `json:"env,omitempty"`
	RootFS string   `json:"rootfs,omitempty"`
	// MPI ("openmpi" or "mpich") runs Args as the rank's part of an MPI
	// job: the node's cairn tools are mounted read-only in the rank (at
	// $CAIRN_TOOLS) and the rank's init is cairn's launch daemon, which
	// starts Args through the MPI launcher in rank 0 (docs/mpi.md).
	MPI string `json:"mpi,omitempty"`
	// Cwd is the working directory of Args in the rank.
	Cwd string `json:"cwd,omitempty"`
	// Volumes bind host directories into the rank, "HOST:PATH" or
	// "HOST:PATH:ro"; outside the rank's checkpoints.
	Volumes []string `json:"volumes,omitempty"`
	CPUs    float64  `json:"cpus,omitempty"`   // CPU time limit, in CPUs (0: none)
	Memory  int64    `json:"memory,omitempty"` // memory limit, bytes (0: none)
	// PidsLimit bounds the rank's processes and threads (0: the node's
	// default; negative: none).
	PidsLimit int64 `json:"pids_limit,omitempty"`
}

// RankRestore restores a rank from its image of checkpoint Seq, which must
// be on this node (see Fetch), frozen and with its network locked, for
// RankResume to start once every rank of the job is restored.
type RankRestore struct {
	Rank
	Net  JobNet `json:"net"`
	Addr string `json:"addr"`
	Seq  int    `json:"seq"`
	// Lazy, when the node does not hold the image, restores the rank
	// lazily from these holders of it: the rank resumes before all of its
	// memory is here, and CRIU's lazy-pages daemon takes the rest from
	// them while it runs (docs/lazy.md). The reply comes once the rank is
	// restored; the pages go on arriving after the resume.
	Lazy []Holder `json:"lazy,omitempty"`
	// Tier, when the node does not hold the image, restores the rank
	// lazily from the durable tier, as Lazy does from holders.
	Tier *TierSource `json:"tier,omitempty"`
	// Stream, when the node does not hold the image, restores the rank
	// eagerly from these holders: the image is written to staging as its
	// chunks arrive, from any holder still serving, and restored once
	// whole; the node's store takes its copy afterwards (a Fetch).
	Stream []Holder `json:"stream,omitempty"`
}

// TierSource is a rank's image in the durable tier: the job's repo and
// the image's record, as the tier's record of the global checkpoint
// gives it (see TierFetch).
type TierSource struct {
	URL    string          `json:"url"`
	Record json.RawMessage `json:"record"`
}

// RankResume unlocks and thaws restored ranks.
type RankResume struct {
	Ranks []Rank `json:"ranks"`
}

// RankRemove removes a rank's container and network namespace, killing
// it first; its checkpoint images stay. Missing pieces are not errors.
type RankRemove struct {
	Rank
	VNI  uint32 `json:"vni"`
	Addr string `json:"addr"`
	// Keep stops the rank but keeps its container's dir: it is restored
	// on this node next, and its output stays as an earlier incarnation's.
	Keep bool `json:"keep,omitempty"`
}

// Prepare is phase one of a global checkpoint for one rank: lock its
// network, freeze it, dump it and stage the image. The agent thaws and
// unlocks the rank by itself if neither Commit nor Abort comes within
// Hold: no rank stays frozen because a coordinator went away.
type Prepare struct {
	Rank
	Seq  int           `json:"seq"`
	Hold time.Duration `json:"hold_ns"`
	// MemoryWait bounds the wait for the memory of a rank whose lazy
	// restore is still going on (0: the agent's default): the rank is
	// dumped once every page is here, or its prepare fails.
	MemoryWait time.Duration `json:"memory_wait_ns,omitempty"`
}

// Prepared is the reply to Prepare.
type Prepared struct {
	Size int64         `json:"size"`    // staged image bytes
	Dump time.Duration `json:"dump_ns"` // lock, freeze, capture and dump
	CRIU time.Duration `json:"criu_ns"` // of which the dump by runc and CRIU
	// MemoryWait is how long, of Dump, the memory of the rank's lazy
	// restore was waited for before the rank was locked and frozen.
	MemoryWait time.Duration `json:"memory_wait_ns,omitempty"`
}

// Finish commits or aborts a prepared rank: in both cases the rank is
// unlocked and thawed first, unless Stop.
type Finish struct {
	Rank
	Seq int `json:"seq"`
	// Stop (commit only): the rank never runs again. Its processes are
	// killed while still frozen, its network stays locked and its
	// container shows checkpointed; then the image is stored. A commit
	// sent again with Stop ends the rank if it still runs, whatever the
	// reply.
	Stop bool `json:"stop,omitempty"`
}

// Committed is the reply to a commit: the image is in the node's store.
type Committed struct {
	Checkpoint
	Stall time.Duration `json:"stall_ns"` // frozen time on this node
}

// Fetch copies checkpoint Container:Seq from the agent at From (host:port,
// certificate name FromNode), and from the Also holders in parallel, into
// this node's store, verifying every chunk. An image already here is not
// fetched again.
type Fetch struct {
	Container string `json:"container"`
	Seq       int    `json:"seq"`
	From      string `json:"from"`
	FromNode  string `json:"from_node"`
	// Also names other holders of the same image. The chunks this node
	// lacks are fetched from all holders at once, each taking the next
	// share as it finishes one; a holder that fails or serves damage
	// hands what it had left to the others.
	Also []Holder `json:"also,omitempty"`
	// Rate limits the transfer to this many bytes per second (0: none),
	// so that background replication leaves the network to the job.
	Rate int64 `json:"rate,omitempty"`
	// Repair makes a node that has the image already read all of it and
	// fetch again, from From, whatever does not read back intact.
	Repair bool `json:"repair,omitempty"`
	// Background copies at the lowest CPU and I/O priority on both nodes
	// (replication), rather than as fast as possible (a restart waits).
	Background bool `json:"background,omitempty"`
}

// Image is the reply to Fetch.
type Image struct {
	Checkpoint
	Fetched  bool          `json:"fetched"` // false: it was already here (and intact, with Repair)
	Bytes    int64         `json:"bytes"`   // bytes received
	Duration time.Duration `json:"duration_ns"`
	// Repaired counts the damaged chunks replaced (Repair); RepairedManifest
	// says the image's manifest was damaged and replaced.
	Repaired         int  `json:"repaired,omitempty"`
	RepairedManifest bool `json:"repaired_manifest,omitempty"`
	// Holders says what each holder sent, in the order asked.
	Holders []HolderShare `json:"holders,omitempty"`
}

// Holder is an agent that holds a copy of an image.
type Holder struct {
	Addr string `json:"addr"` // host:port
	Node string `json:"node"` // its certificate name
}

// HolderShare is what one holder sent for a Fetch.
type HolderShare struct {
	Node   string `json:"node"`
	Chunks int    `json:"chunks"` // chunks received from it, verified
	Bytes  int64  `json:"bytes"`
	// Error says why the holder was given up, if it was; Damaged says it
	// served data that did not verify (its copy needs a repair).
	Error   string `json:"error,omitempty"`
	Damaged bool   `json:"damaged,omitempty"`
}

// ChunkData asks for chunks of a checkpoint image as a chunk stream
// (docs/format.md), in the order given; every id must be one of the
// image's chunks.
type ChunkData struct {
	Container string   `json:"container"`
	Seq       int      `json:"seq"`
	IDs       []string `json:"ids"`
	// Background streams at the lowest CPU and I/O priority.
	Background bool `json:"background,omitempty"`
	// Version is the chunk stream version to send: 2, whose checksum
	// covers the records' headers only; 0 or 1, version 1 (what a
	// release that knows no other asks for).
	Version int `json:"version,omitempty"`
}

// Chunks lists the chunk ids (hex) a checkpoint image is made of.
type Chunks struct {
	IDs []string `json:"ids"`
}

// ExportDelta asks for a checkpoint image as a delta stream holding only
// the Missing chunks (hex ids): the rest the caller has.
type ExportDelta struct {
	Container string   `json:"container"`
	Seq       int      `json:"seq"`
	Missing   []string `json:"missing"`
	// Background streams at the lowest CPU and I/O priority.
	Background bool `json:"background,omitempty"`
}

// RankStall locks the network of ranks and freezes them, the first phase
// of a migration for the ranks that stay. RankResume ends it; the agent
// unlocks and thaws them by itself if no RankResume comes within Hold.
type RankStall struct {
	Ranks []Rank        `json:"ranks"`
	Hold  time.Duration `json:"hold_ns"`
}

// MigrateIn brings a rank prepared on another node (Prepare with Seq, so
// it is frozen and dumped there) to this node: its staged image streams
// from From (PathStaged) straight into this node's staging (tmpfs), and
// the rank is restored from there, frozen, with its network locked, for
// RankResume; neither node's store is involved. If no RankResume comes within Hold
// the restored rank is removed (its source thaws by itself then).
type MigrateIn struct {
	Rank
	Seq      int           `json:"seq"`
	From     string        `json:"from"`
	FromNode string        `json:"from_node"`
	Net      JobNet        `json:"net"`
	Addr     string        `json:"addr"`
	Hold     time.Duration `json:"hold_ns"`
	// PostCopy restores the rank before its memory is here: the stream
	// carries its pages files as holes, and the pages come from From
	// (PathStagedPages) as the rank touches them and in the background,
	// while it runs; if From fails before every page is here, the rank
	// is killed.
	PostCopy bool `json:"post_copy,omitempty"`
}

// MigratedIn is the reply to MigrateIn.
type MigratedIn struct {
	Bytes   int64         `json:"bytes"`      // the staged image received
	Move    time.Duration `json:"move_ns"`    // receiving it
	Restore time.Duration `json:"restore_ns"` // restoring the rank, frozen
}

// MigrateOut ends a migration on the source: the rank prepared as Seq
// moved away, so its container is removed (its network stays locked until
// it is gone) and its staged image dropped.
type MigrateOut struct {
	Rank
	Seq  int    `json:"seq"`
	VNI  uint32 `json:"vni"`
	Addr string `json:"addr"`
	// Donor keeps the staged pages, once the container is gone, for a
	// post-copy target to read until it says it has them all
	// (PathStagedDone) or stops asking.
	Donor bool `json:"donor,omitempty"`
}

// DropImages removes every checkpoint image of the named containers from
// the node's catalog (a removed job's ranks); the store reclaims their
// chunks at its next gc.
type DropImages struct {
	Containers []string `json:"containers"`
	// Seqs, if set, narrows the drop to those checkpoints of the
	// containers (retention); a checkpoint the node lacks is skipped.
	Seqs []int `json:"seqs,omitempty"`
}

// Dropped is the reply to DropImages.
type Dropped struct {
	Images int `json:"images"`
}
