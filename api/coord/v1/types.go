package v1

import (
	"strings"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// Paths of the coordinator API.
const (
	PathHealth    = "/v1/health"          // GET: Health
	PathJoin      = "/v1/nodes/join"      // POST Join (agents): JoinReply
	PathHeartbeat = "/v1/nodes/heartbeat" // POST Heartbeat (agents): HeartbeatReply; 404 means join again
	PathNodes     = "/v1/nodes"           // GET: []Node
	PathRenew     = "/v1/nodes/renew"     // POST RenewCert (agents): RenewCertReply; CodeNoCA when the coordinator holds no CA
	// GET: []Coordinator, answered by every coordinator, leader or not.
	PathCoordinators = "/v1/coordinators"
	// GET ?after=SEQ&since=RFC3339&job=J&type=PATTERN&follow=1: the
	// events (api/events/v1) as JSON lines; with follow, then new ones
	// as they come.
	PathEvents = "/v1/events"
	PathNode   = "/v1/nodes/" // + NAME + SuffixSpare, POST Spare: Node
	PathJobs   = "/v1/jobs"   // GET: []Job; POST RunJob: Job
	PathJob    = "/v1/jobs/"  // + NAME: GET JobStatus; DELETE ?force=1: Removed
	// + NAME + one of these, POST:
	SuffixKill        = "/kill"        // Kill: Job
	SuffixCheckpoint  = "/checkpoint"  // Ckpt, once the round has ended
	SuffixRestart     = "/restart"     // Restart: Job
	SuffixCheckpoints = "/checkpoints" // GET: []Ckpt; + "/" + SEQ: DELETE: CkptRemoved; + SuffixPin: POST Pin: Ckpt
	SuffixSpare       = "/spare"       // (nodes) POST Spare: Node
	SuffixPin         = "/pin"         // (a job's checkpoint) POST Pin: Ckpt
	SuffixFlush       = "/flush"       // POST Flush: Ckpt, once flushed
	SuffixMigrate     = "/migrate"     // POST Migrate: Migration, once it has ended
	SuffixMigrations  = "/migrations"  // GET: []Migration
	SuffixDrain       = "/drain"       // (nodes) POST Drain: DrainResult
)

// Kill sends a signal to every rank of a job (0 means SIGKILL). A job
// killed with SIGKILL is "killed"; with another signal its ranks may end as
// they choose.
type Kill struct {
	Signal int `json:"signal,omitempty"`
}

// Removed says what removing a job deleted. Without force, a job that has
// checkpoints or running ranks is refused (code conflict) and nothing is
// deleted.
type Removed struct {
	Job    string `json:"job"`
	Ranks  int    `json:"ranks"`  // rank containers removed
	Ckpts  int    `json:"ckpts"`  // global checkpoints deleted from the catalog
	Images int    `json:"images"` // rank images (own copies and replicas) dropped on live nodes
}

// Spare marks a node as a spare (no new jobs are placed on it; restarts
// and migrations go there first) or not.
type Spare struct {
	Spare bool `json:"spare"`
}

// Error is the body of every non-2xx reply (the agent API's).
type Error = agentv1.Error

// Error codes beyond the agent API's.
const (
	CodeNoNodes  = "no_nodes"  // not enough live nodes for the request
	CodeNoCkpt   = "no_ckpt"   // no checkpoint that can be restored
	CodeConflict = "conflict"  // e.g. a round already runs for the job
	CodeAborted  = "aborted"   // the checkpoint round aborted
	CodeNodeDead = "node_dead" // a node the request needs is not alive
	// CodeRateLimited: too many requests of a kind (a rank's events).
	CodeRateLimited = "rate_limited"
	// CodeNotLeader: this coordinator stands by and did nothing; ask the
	// leader (its address is in the message), or another coordinator.
	CodeNotLeader = "not_leader"
	// CodeDeposed: this coordinator lost its leadership while it handled
	// the request, which may be partly done: the new leader finishes or
	// undoes it; look before sending it again.
	CodeDeposed = "deposed"
	// CodeVersion: the caller speaks another version of the API (an agent
	// that joins, of another API version than the coordinator's).
	CodeVersion = "version"
	// CodeNoCA: the coordinator holds no CA (coordinator --ca), so it
	// cannot renew certificates.
	CodeNoCA = "no_ca"
)

// APIVersion is the version of the coordinator and agent APIs this
// package and api/agent/v1 define. A coordinator and an agent of the same
// APIVersion work together whatever their releases; one of another is
// refused at join.
const APIVersion = "v1"

// Health says who answers.
type Health struct {
	Cluster string `json:"cluster"`
	Version string `json:"version"`
	Etcd    string `json:"etcd"` // "embedded" or the endpoints
}

// Join registers an agent's node; its name is the one in its certificate.
type Join struct {
	Name     string            `json:"name"`
	Addr     string            `json:"addr"`     // agent API host:port
	Underlay string            `json:"underlay"` // address other nodes reach it at (VXLAN)
	Labels   map[string]string `json:"labels,omitempty"`
	// API is the API version the agent speaks (APIVersion; "": an agent
	// from before it said, which spoke v1); Version its release (cairn
	// version), shown with the node.
	API     string `json:"api,omitempty"`
	Version string `json:"version,omitempty"`
	// CPU lists the CPU features the node offers programs (cpufeat): a
	// job's ranks go only where every feature of the nodes they started
	// on is.
	CPU []string `json:"cpu,omitempty"`
}

// PathBackup: GET (clients) a backup of the catalog and the event
// history, a tar stream (cairn catalog backup); its BackupInfo is the
// tar's first file, backup.json.
const PathBackup = "/v1/backup"

// BackupInfo says what a backup holds.
type BackupInfo struct {
	Cluster  string    `json:"cluster"`
	Time     time.Time `json:"time"`
	Revision int64     `json:"revision"` // the catalog's, where the keys were read
	Keys     int       `json:"keys"`
	Events   int       `json:"events"`
}

// RenewCert asks the coordinator to renew the caller's certificate. The
// new certificate says what the caller's current one says (the one its
// connection presented); only the key is the request's.
type RenewCert struct {
	CSR []byte `json:"csr"` // a certificate request (DER) signed by the new key
}

// RenewCertReply is the renewed certificate.
type RenewCertReply struct {
	Cert []byte `json:"cert"` // DER, signed by the cluster CA
}

// JoinReply tells the agent how often to send heartbeats.
type JoinReply struct {
	Heartbeat time.Duration `json:"heartbeat_ns"`
	TTL       time.Duration `json:"ttl_ns"` // a node silent for that long is dead
	// Term is the leading coordinator's term (agentv1.Term.String): the
	// agent refuses calls of older terms from then on.
	Term string `json:"term,omitempty"`
}

// HeartbeatReply is the answer to a heartbeat.
type HeartbeatReply struct {
	Term string `json:"term,omitempty"` // as JoinReply's
	// Release and Drop answer Heartbeat.Fenced and Live: the ranks still
	// placed on the node, to thaw, and those placed elsewhere or of jobs
	// that ended or are gone, to stop (their output kept). A fenced rank
	// in neither stays frozen (its job is busy) and is asked about again.
	Release []string `json:"release,omitempty"`
	Drop    []string `json:"drop,omitempty"`
}

// Heartbeat keeps a node's membership alive.
type Heartbeat struct {
	Name string `json:"name"`
	// Health lists the node's failing health probes; empty when healthy.
	Health []string `json:"health,omitempty"`
	// Quarantined describes each damaged pack the node's store has set
	// aside in its quarantine/ (one line each, the pack's id first).
	Quarantined []string `json:"quarantined,omitempty"`
	// Ended names the node's rank containers ("JOB.RANK") whose processes
	// have ended, by themselves or killed, and that no checkpoint
	// stopped: the coordinator then looks at how their jobs stand.
	Ended []string `json:"ended,omitempty"`
	// Fenced names the rank containers the node's agent froze because no
	// coordinator answered it for half the node TTL (it may have been
	// cut off, and its ranks restarted elsewhere): they stay frozen
	// until a reply says which to thaw and which to stop.
	Fenced []string `json:"fenced,omitempty"`
	// Live names the node's rank containers that have not ended: the
	// coordinator has the node stop those no job places there (left by a
	// start or restart whose undo could not reach the node).
	Live []string `json:"live,omitempty"`
}

// Node is a cluster node as the catalog records it.
type Node struct {
	Name     string            `json:"name"`
	Addr     string            `json:"addr"`
	Underlay string            `json:"underlay"`
	Labels   map[string]string `json:"labels,omitempty"`
	Joined   time.Time         `json:"joined"`
	Alive    bool              `json:"alive"`
	Ranks    int               `json:"ranks"` // ranks of jobs placed on it
	Spare    bool              `json:"spare,omitempty"`
	Drained  bool              `json:"drained,omitempty"` // no ranks placed here; its ranks were moved away
	Health   []string          `json:"health,omitempty"`  // failing health probes, as last reported
	// Quarantined lists the damaged packs the node's store set aside, as
	// last reported.
	Quarantined []string `json:"quarantined,omitempty"`
	// Version is the release of the node's agent, as it joined.
	Version string `json:"version,omitempty"`
	// CPU lists the CPU features its agent reported at its join.
	CPU []string `json:"cpu,omitempty"`
}

// RunJob starts a job.
type RunJob struct {
	Name    string   `json:"name"`
	Ranks   int      `json:"ranks"`
	PerNode int      `json:"per_node,omitempty"` // at most this many ranks per node; 0: spread evenly
	Nodes   []string `json:"nodes,omitempty"`    // only these nodes
	Args    []string `json:"args"`
	Env     []string `json:"env,omitempty"`
	RootFS  string   `json:"rootfs,omitempty"`
	// MPI, if set ("openmpi" or "mpich"), runs Args as an MPI program of
	// Ranks processes, one per rank: every rank's init is cairn's launch
	// daemon, and rank 0's starts the MPI launcher (docs/mpi.md).
	MPI string `json:"mpi,omitempty"`
	// Mode is how the job's ranks are checkpointed: "transparent" (or
	// empty: CRIU dumps them) or "app" (application-level: every rank
	// saves its own state when told, through the rank API; docs/rank-api.md).
	Mode string `json:"mode,omitempty"`
	// Cwd is the ranks' working directory; Volumes bind host directories
	// into every rank ("HOST:PATH[:ro]", the same path on every node: a
	// shared file system), outside the checkpoints; CPUs and Memory (bytes)
	// limit each rank (0: no limit); PidsLimit bounds each rank's processes
	// and threads (0: the default, 4096; negative: none).
	Cwd             string        `json:"cwd,omitempty"`
	Volumes         []string      `json:"volumes,omitempty"`
	CPUs            float64       `json:"cpus,omitempty"`
	Memory          int64         `json:"memory,omitempty"`
	PidsLimit       int64         `json:"pids_limit,omitempty"`
	CheckpointEvery time.Duration `json:"checkpoint_every_ns,omitempty"`
	// CheckpointAuto, instead of CheckpointEvery, has the coordinator
	// choose the interval from the job's measured checkpoint cost and
	// its mean time between failures (Job.Interval; docs/planning.md).
	CheckpointAuto bool `json:"checkpoint_auto,omitempty"`
	// MTBF is the mean time between failures of one of the job's nodes,
	// for CheckpointAuto; 0: the cluster's (estimated from its node
	// failures, or the coordinator's --mtbf).
	MTBF time.Duration `json:"mtbf_ns,omitempty"`
	// Replicas is how many other nodes get a copy of every rank image of
	// every checkpoint, in the background after it is durable.
	Replicas int `json:"replicas"`
	// OnFailure says what happens when a node holding a rank dies:
	// OnFailureRestart (restart from the newest restorable checkpoint) or
	// OnFailureStop.
	OnFailure   string `json:"on_failure,omitempty"`
	MaxRestarts int    `json:"max_restarts,omitempty"` // automatic restarts allowed; 0: no limit
	// ReplicationRate limits each replica transfer to this many bytes
	// per second (0: no limit). Restarts fetch at full speed.
	ReplicationRate int64 `json:"replication_rate,omitempty"`
	// OnHealthWarning says what happens when a health probe of a node
	// holding a rank goes bad: HealthMigrate (move the ranks there to
	// other nodes), HealthCheckpoint (take a checkpoint now) or
	// HealthIgnore (the default).
	OnHealthWarning string `json:"on_health_warning,omitempty"`
	// LazyRestore restores a rank whose node lacks its image lazily, on
	// restarts: the rank runs before all of its memory has arrived, and
	// the rest comes from the image's holders while it runs
	// (docs/lazy.md). Ranks on nodes that hold their image restore from
	// it as usual.
	LazyRestore bool `json:"lazy_restore,omitempty"`
	// KillOnBadExit ends the job as soon as one of its ranks ends other
	// than by exiting 0 (srun --kill-on-bad-exit): its other ranks are
	// killed and the job is failed. Without it the job is failed once
	// every rank has ended.
	KillOnBadExit bool `json:"kill_on_bad_exit,omitempty"`
	// Keep is how many of its newest protected checkpoints the job keeps
	// (0: all). Each time one more is protected, the coordinator removes
	// the older ones, pinned ones excepted, from the catalog, then from
	// every live node's store and replica (cairn checkpoint pin keeps
	// one).
	Keep int `json:"keep,omitempty"`
	// Tier is the durable tier the job's checkpoints are flushed to
	// (s3://BUCKET[/PREFIX] or file:///DIR; the job's images go under
	// JOB/ there), with the agents' credentials; "" for none. FlushEvery
	// flushes every Nth checkpoint once protected (0: only cairn flush).
	Tier       string `json:"tier,omitempty"`
	FlushEvery int    `json:"flush_every,omitempty"`
}

// Health warning policies of a job.
const (
	HealthMigrate    = "migrate"
	HealthCheckpoint = "checkpoint"
	HealthIgnore     = "ignore"
)

// Failure policies of a job.
const (
	OnFailureRestart = "restart"
	OnFailureStop    = "stop"
)

// JobState is where a job stands.
type JobState string

// Job states.
const (
	JobStarting   JobState = "starting"
	JobRunning    JobState = "running" // started or restarted; its ranks may have exited since
	JobKilled     JobState = "killed"  // cairn kill: processes gone, job and checkpoints kept
	JobRestarting JobState = "restarting"
	// JobFailed: a rank ended other than by exiting 0 (Reason says how
	// each did), a start or restart failed, or an automatic restart gave
	// up (Reason says why); cairn restart may bring it back.
	JobFailed JobState = "failed"
	JobLost   JobState = "lost"   // a node of it died and its policy is stop, or restarts ran out
	JobExited JobState = "exited" // every rank exited 0; no more rounds
	// JobStopped: a checkpoint with Stop ended every rank at it (Reason
	// names it); cairn restart resumes the job from there.
	JobStopped JobState = "stopped"
)

// Job is a job as the catalog records it.
type Job struct {
	RunJob
	VNI          uint32    `json:"vni"`
	Subnet       string    `json:"subnet"`
	Addrs        []string  `json:"addrs"`     // rank address, by rank
	Placement    []string  `json:"placement"` // rank node, by rank
	State        JobState  `json:"state"`
	Reason       string    `json:"reason,omitempty"`
	Created      time.Time `json:"created"`
	Restarts     int       `json:"restarts"`
	NextCkpt     int       `json:"next_ckpt"` // number of the next checkpoint round
	LastCkpt     int       `json:"last_ckpt"` // newest durable checkpoint; 0: none
	RestoredFrom int       `json:"restored_from,omitempty"`
	// RestartFrom is the checkpoint a restart under way restores, so that
	// a coordinator that died during it finishes the same restart.
	RestartFrom int `json:"restart_from,omitempty"`
	// RestartPhase is where a restart under way stands: "restoring"
	// (what is left of the job is removed and its ranks restored,
	// frozen) or "resuming" (every rank is restored; they are resumed).
	RestartPhase string `json:"restart_phase,omitempty"`
	// Leftover lists, by rank, the nodes that may still hold a container
	// of the rank while a restart is under way, or after one failed:
	// where it ran before, and where a restart cut short put it. It also
	// keeps, while the job runs, the nodes a restart could not reach (not
	// alive then), for the next restart to clear once they are back.
	Leftover   [][]string `json:"leftover,omitempty"`
	Migrations int        `json:"migrations,omitempty"` // ranks moved so far
	// StoppedAt is the checkpoint a stop round stopped the job at (set
	// once its commit is decided; State stopped), until a restart.
	StoppedAt int `json:"stopped_at,omitempty"`
	// Interval is the interval of a job with CheckpointAuto, as last
	// chosen, and why; nil until the coordinator has chosen one.
	Interval *Interval `json:"interval,omitempty"`
	// CPU lists the CPU features of the nodes the job's ranks started on:
	// their processes may use any of them, so a restart or a migration
	// puts a rank only on a node that has them all.
	CPU []string `json:"cpu,omitempty"`
}

// Ended says whether the job has no ranks running any more (killed,
// failed, exited, stopped), so that its nodes carry none of its load.
func (j Job) Ended() bool {
	return j.State == JobKilled || j.State == JobFailed || j.State == JobExited || j.State == JobStopped
}

// Rank is the live state of one rank.
type Rank struct {
	Rank     int            `json:"rank"`
	Node     string         `json:"node"`
	Addr     string         `json:"addr"`
	Alive    bool           `json:"node_alive"`
	Status   agentv1.Status `json:"status"` // the container's status, or RankUnknown or RankMissing
	Pid      int            `json:"pid,omitempty"`
	ExitCode *int           `json:"exit_code,omitempty"`
	// EndedBy: its node ended it, not its program (agentv1.Container).
	EndedBy string `json:"ended_by,omitempty"`
	Error   string `json:"error,omitempty"`
}

// What a rank's status is when its container's cannot be told.
const (
	RankUnknown agentv1.Status = "unknown" // its node did not answer
	RankMissing agentv1.Status = "missing" // its node has no such container
)

// JobStatus is a job with the live state of its ranks.
type JobStatus struct {
	Job
	RankStates []Rank `json:"rank_states"`
	Exited     bool   `json:"exited"` // every rank has exited
	Failed     bool   `json:"failed"` // some rank exited non-zero or is gone
}

// CkptState is where a global checkpoint stands.
type CkptState string

// Checkpoint states.
const (
	CkptPreparing CkptState = "preparing"
	CkptCommitted CkptState = "committed"
	CkptDurable   CkptState = "durable"
	CkptProtected CkptState = "protected" // every rank image has Replicas copies on other nodes
	CkptAborted   CkptState = "aborted"
)

// CkptRank is one rank's part of a global checkpoint.
type CkptRank struct {
	Rank int    `json:"rank"`
	Node string `json:"node"` // where it was taken
	// Copies are the nodes holding a complete, verified copy of the
	// image: Node first, then its replicas.
	Copies []string      `json:"copies,omitempty"`
	State  string        `json:"state"`
	Size   int64         `json:"size,omitempty"`
	Dump   time.Duration `json:"dump_ns,omitempty"` // its agent's prepare: lock, freeze, capture files, dump
	CRIU   time.Duration `json:"criu_ns,omitempty"` // of which the dump by runc and CRIU
	// MemoryWait is how long, of Dump, its agent waited for the memory
	// of its lazy restore to arrive before it froze the rank (the rest
	// of the job stalled meanwhile).
	MemoryWait time.Duration `json:"memory_wait_ns,omitempty"`
	Reason     string        `json:"reason,omitempty"`
	// Ingest is from the commit to the image stored; NewBytes are the
	// image's bytes its node's store lacked.
	Ingest   time.Duration `json:"ingest_ns,omitempty"`
	NewBytes int64         `json:"new_bytes,omitempty"`
}

// Ckpt is a global checkpoint of a job.
type Ckpt struct {
	Job      string        `json:"job"`
	Seq      int           `json:"seq"`
	State    CkptState     `json:"state"`
	Reason   string        `json:"reason,omitempty"`
	Created  time.Time     `json:"created"`
	Decided  time.Time     `json:"decided,omitempty"`
	Finished time.Time     `json:"finished,omitempty"`
	Ranks    []CkptRank    `json:"ranks"`
	Stall    time.Duration `json:"stall_ns,omitempty"` // ranks frozen, as the coordinator saw it
	Coord    time.Duration `json:"coord_ns,omitempty"` // stall minus the slowest prepare: t_coord
	Cont     time.Duration `json:"cont_ns,omitempty"`  // the slowest prepare minus its CRIU dump: t_cont
	MaxDump  time.Duration `json:"max_dump_ns,omitempty"`
	Persist  time.Duration `json:"persist_ns,omitempty"` // writing the decision
	Ingest   time.Duration `json:"ingest_ns,omitempty"`
	Bytes    int64         `json:"bytes,omitempty"`
	Periodic bool          `json:"periodic,omitempty"`
	// Stop: once committed, every rank was ended at this checkpoint
	// instead of thawed (CheckpointJob.Stop).
	Stop bool `json:"stop,omitempty"`
	// Pinned: retention (RunJob.Keep) never removes it.
	Pinned bool `json:"pinned,omitempty"`
	// Flushed says where the checkpoint was flushed to the durable tier,
	// nil if it was not.
	Flushed *Flushed `json:"flushed,omitempty"`
	// Copied is when its images were copied to other nodes, and how
	// much: copies that overlap or follow each other within a second
	// make one span (a repair after a node loss makes another).
	Copied []CopySpan `json:"copied,omitempty"`
	// Unavailable lists, for a durable or protected checkpoint as the
	// coordinator lists it, the ranks none of whose copies is on a live
	// node now (their nodes died before replication, or all of them): it
	// cannot be restored unless such a node comes back. Never for one in
	// the job's durable tier, which a restart reads. Computed when
	// listed; never stored.
	Unavailable []int `json:"unavailable,omitempty"`
}

// CopySpan is a stretch of time during which images of a checkpoint were
// being copied to other nodes.
type CopySpan struct {
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	Copies int       `json:"copies"`
	Bytes  int64     `json:"bytes"` // what the receivers fetched
}

// Flush flushes a job's checkpoint (Seq; 0: the newest restorable one) to
// the job's durable tier, or to Tier if given (POST SuffixFlush).
type Flush struct {
	Seq  int    `json:"seq,omitempty"`
	Tier string `json:"tier,omitempty"`
}

// Flushed is a checkpoint in the durable tier: where (the job's repo
// there), when, what its flush uploaded, and its images' manifests (what
// the tier's retention keeps).
type Flushed struct {
	URL       string        `json:"url"`
	At        time.Time     `json:"at"`
	Duration  time.Duration `json:"duration_ns"`
	Chunks    int           `json:"chunks"`
	NewChunks int           `json:"new_chunks"`
	Bytes     int64         `json:"bytes"` // uploaded
	Manifests []string      `json:"manifests"`
}

// TierCkpt is the record of a global checkpoint in the durable tier:
// what a restart elsewhere needs besides the images (the job as it was,
// the checkpoint, each rank's image record), written once every image is
// flushed. A record read back is hostile input: checked before use.
type TierCkpt struct {
	Version int                 `json:"version"`
	Job     Job                 `json:"job"`
	Ckpt    Ckpt                `json:"ckpt"`
	Images  []agentv1.TierImage `json:"images"` // by rank
}

// TierRepo is where job's checkpoints are in the durable tier at base:
// base/JOB.
func TierRepo(base, job string) string { return strings.TrimSuffix(base, "/") + "/" + job }

// TierCkptVersion is the version of TierCkpt this cairn writes.
const TierCkptVersion = 1

// Pin pins a job's checkpoint (retention never removes it) or unpins it.
type Pin struct {
	Pinned bool `json:"pinned"`
}

// CkptRemoved says what removing a job's checkpoint did.
type CkptRemoved struct {
	Job    string `json:"job"`
	Seq    int    `json:"seq"`
	Images int    `json:"images"` // rank images (own copies and replicas) dropped on live nodes
}

// CheckpointJob asks for a global checkpoint of a job (POST
// SuffixCheckpoint; an empty body asks for a plain one).
type CheckpointJob struct {
	// Stop: once the checkpoint is committed, every rank is ended at it
	// instead of thawed, so that the job never runs on past it; the job
	// is then stopped, and cairn restart resumes it from there. A round
	// that aborts stops nothing: the job runs on.
	Stop bool `json:"stop,omitempty"`
}

// Restart restarts a job from a checkpoint.
type Restart struct {
	From  int      `json:"from,omitempty"`  // checkpoint number; 0: the newest restorable
	Nodes []string `json:"nodes,omitempty"` // place ranks on these nodes
	// Placement, if set, gives the node of every rank, by rank.
	Placement []string `json:"placement,omitempty"`
	// Lazy, if set, says whether ranks restored on nodes that lack their
	// image restore lazily (RunJob.LazyRestore); nil: as the job says.
	Lazy *bool `json:"lazy,omitempty"`
	// Tier, if set, restarts the job from the durable tier at that URL
	// (its checkpoint From, or the newest there), on a cluster that may
	// not know the job: the job's record comes from the tier's, each
	// rank's image is fetched to its node first, and the job keeps
	// flushing there.
	Tier string `json:"tier,omitempty"`
}

// Migrate moves one rank of a running job to another node (To; empty:
// a spare first, else the least loaded node) while the rest of the job
// waits.
type Migrate struct {
	Rank int    `json:"rank"`
	To   string `json:"to,omitempty"`
	// PostCopy moves the rank without its memory: it runs on the target
	// as soon as it is restored there, its pages following from the
	// source as it touches them and in the background. The job then
	// waits only for the dump and the rank's other files; but if the
	// source fails before every page has arrived, the rank is killed and
	// the job restarts from its newest checkpoint.
	PostCopy bool `json:"post_copy,omitempty"`
}

// MigrationState is where a migration stands.
type MigrationState string

// Migration states.
const (
	MigrationRunning MigrationState = "migrating"
	MigrationDone    MigrationState = "done"
	MigrationFailed  MigrationState = "failed" // the job resumed where it was
)

// Migration is the catalog's record of one rank's move. Its number comes
// from the job's sequence of checkpoint numbers (no checkpoint takes it:
// a moved image is no consistent cut of the job, and is not stored).
type Migration struct {
	Job      string         `json:"job"`
	Seq      int            `json:"seq"`
	Rank     int            `json:"rank"`
	From     string         `json:"from"`
	To       string         `json:"to"`
	State    MigrationState `json:"state"`
	Reason   string         `json:"reason,omitempty"`
	Started  time.Time      `json:"started"`
	Finished time.Time      `json:"finished,omitempty"`
	Stall    time.Duration  `json:"stall_ns,omitempty"` // every rank frozen: phases 1-4
	Dump     time.Duration  `json:"dump_ns,omitempty"`  // phase 1: the moving rank dumped (the others frozen meanwhile)
	// MemoryWait is how long, of Dump, phase 1 first waited for the
	// memory of the moving rank's lazy restore to arrive.
	MemoryWait time.Duration `json:"memory_wait_ns,omitempty"`
	Move       time.Duration `json:"move_ns,omitempty"`    // phase 2: the image streamed to the target
	Restore    time.Duration `json:"restore_ns,omitempty"` // phase 3: restored there
	Resume     time.Duration `json:"resume_ns,omitempty"`  // phase 4
	Bytes      int64         `json:"bytes,omitempty"`
	// PostCopy: the rank moved without its memory (Migrate.PostCopy);
	// Bytes are then the files moved before it ran, not its pages.
	PostCopy bool `json:"post_copy,omitempty"`
}

// Drain moves every rank off a node and keeps new ranks away (Undrain:
// lets them come again).
type Drain struct {
	Undrain bool `json:"undrain,omitempty"`
	// PostCopy migrates the node's ranks post-copy (Migrate.PostCopy).
	PostCopy bool `json:"post_copy,omitempty"`
}

// DrainResult is the node after a drain, with the migrations it made.
type DrainResult struct {
	Node       Node        `json:"node"`
	Migrations []Migration `json:"migrations"`
}

// Paths of the rank API's requests, which an agent forwards for a rank of
// a job it holds (docs/rank-api.md). Only agents call them, each for its
// own ranks.
const (
	PathRankCheckpoint = "/v1/ranks/checkpoint" // POST RankRequest: Ckpt, once the round has ended
	PathRankInfo       = "/v1/ranks/info"       // POST RankRequest: RankInfo
	PathRankEvent      = "/v1/ranks/event"      // POST RankRequest
)

// RankRequest is a request of a rank, forwarded by its node's agent.
type RankRequest struct {
	Job  string `json:"job"`
	Rank int    `json:"rank"`
	// Stop (checkpoint): stop the job once the checkpoint is durable.
	Stop bool `json:"stop,omitempty"`
	// Kind and Message (event).
	Kind    string `json:"kind,omitempty"`
	Message string `json:"message,omitempty"`
}

// Modes of a job (RunJob.Mode).
const (
	ModeTransparent = "transparent"
	ModeApp         = "app"
)

// RankInfo is what the coordinator tells a rank of its job.
type RankInfo struct {
	Ckpt int    `json:"ckpt"` // the job's newest durable checkpoint; 0: none
	Mode string `json:"mode"`
}

// Coordinator is one coordinator process of the cluster, as it announces
// itself in the catalog while it runs.
type Coordinator struct {
	Name    string    `json:"name"`
	Addr    string    `json:"addr"` // its API's host:port
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Started time.Time `json:"started"`
	Leader  bool      `json:"leader"`
	// Term is the leader's term (agentv1.Term.String); "" for a
	// coordinator that stands by.
	Term string `json:"term,omitempty"`
	// Since is when the leader took over.
	Since time.Time `json:"since,omitzero"`
}
