package metrics

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Catalog is where the coordinator's metrics read the jobs and nodes: the
// coordinator itself.
type Catalog interface {
	Jobs(ctx context.Context) ([]coordv1.Job, error)
	Nodes(ctx context.Context) ([]coordv1.Node, error)
}

// CoordOptions tune a Coord.
type CoordOptions struct {
	// Also is gathered with the coordinator's own series: the default
	// registry, where the embedded etcd's metrics are (nil: none).
	Also prometheus.Gatherer
	// Certs gives when the coordinator's certificates expire (nil: not
	// exposed).
	Certs CertExpiry
	// Now is the clock of the replication lag; nil means time.Now.
	Now func() time.Time
}

// snapshotEvery is how often at most a scrape reads the catalog.
const snapshotEvery = time.Second

// jobStates are the states of a job, as cairn_job_state and cairn_jobs
// label them.
var jobStates = []coordv1.JobState{coordv1.JobStarting, coordv1.JobRunning, coordv1.JobKilled, coordv1.JobRestarting,
	coordv1.JobFailed, coordv1.JobLost, coordv1.JobExited, coordv1.JobStopped}

// Coord is the coordinator's metrics. Its methods are safe for concurrent
// use.
type Coord struct {
	opts CoordOptions
	defs defs

	gatherMu sync.Mutex // one Gather at a time
	cat      Catalog
	readAt   time.Time // last snapshot

	mu    sync.Mutex
	jobs  map[string]*jobMetrics
	nodes map[string]time.Time // when each node was first seen

	events *prometheus.CounterVec

	jobCount, jobState, jobRanks, jobReplicas, jobInterval *prometheus.GaugeVec

	durable, protected, aborts                   *prometheus.CounterVec
	stall, coordT, cont, dump, ingest            *prometheus.HistogramVec
	imageBytes, newBytes                         *prometheus.CounterVec
	lastImage, lastNew, lastStall                *prometheus.GaugeVec
	lastDurable, lastDurableTime                 *prometheus.GaugeVec
	lastProtected, lastProtectedTime             *prometheus.GaugeVec
	rankDump, rankCRIU, rankIngest, rankImage    *prometheus.GaugeVec
	rankNew                                      *prometheus.GaugeVec
	copies, copiedBytes, copyFails, repairs      *prometheus.CounterVec
	copyTime                                     *prometheus.HistogramVec
	lag, pending                                 *prometheus.GaugeVec
	restarts, restartFails                       *prometheus.CounterVec
	restartTime                                  *prometheus.HistogramVec
	migrations, moved                            *prometheus.CounterVec
	migStall, migPhase                           *prometheus.HistogramVec
	nodeAlive, nodeHealthy, nodeRanks, nodeSpare *prometheus.GaugeVec
	nodeDrained, nodeQuarantined                 *prometheus.GaugeVec
	nodeLost, nodeWarnings                       *prometheus.CounterVec
}

// jobMetrics is what the metrics remember of a job between events.
type jobMetrics struct {
	seen          time.Time         // first event or snapshot that named it
	durable       int               // newest durable checkpoint
	protected     int               // newest protected checkpoint
	unprotected   map[int]time.Time // durable checkpoints newer than the newest protected, and when they became durable
	checkpointSet bool              // a durable checkpoint's per-rank series are set
}

// NewCoord returns the coordinator's metrics, every family registered and
// none with a series yet.
func NewCoord(opts CoordOptions) *Coord {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := &Coord{opts: opts, defs: defs{reg: prometheus.NewRegistry()},
		jobs: map[string]*jobMetrics{}, nodes: map[string]time.Time{}}
	d := &m.defs
	const job, rank, node = "job_name", "rank", "node"

	m.events = d.counter("cairn_events_total", "Events the coordinator published, by type.", "type")

	m.jobCount = d.gauge("cairn_jobs", "Jobs in each state.", "state")
	m.jobState = d.gauge("cairn_job_state", "1 for the state the job is in, 0 for the others.", job, "state")
	m.jobRanks = d.gauge("cairn_job_ranks", "Ranks of the job.", job)
	m.jobReplicas = d.gauge("cairn_job_replicas", "Copies of every rank image the job keeps on other nodes (k).", job)
	m.jobInterval = d.gauge("cairn_job_checkpoint_interval_seconds", "The job's periodic checkpoint interval; 0: none.", job)

	m.durable = d.counter("cairn_checkpoints_durable_total", "Global checkpoints that became durable (every rank image stored).", job)
	m.protected = d.counter("cairn_checkpoints_protected_total", "Global checkpoints that became protected (every rank image has its copies on live nodes).", job)
	m.aborts = d.counter("cairn_checkpoint_aborts_total", "Checkpoint rounds aborted before the decision, by reason: "+strings.Join(AbortReasons, ", ")+".", job, "reason")
	m.stall = d.histogram("cairn_checkpoint_stall_seconds", "How long the ranks stayed frozen in a durable checkpoint's round.", roundBuckets, job)
	m.coordT = d.histogram("cairn_checkpoint_coord_seconds", "t_coord of a durable checkpoint: the stall minus the slowest prepare.", roundBuckets, job)
	m.cont = d.histogram("cairn_checkpoint_cont_seconds", "t_cont of a durable checkpoint: the slowest prepare minus its CRIU dump.", roundBuckets, job)
	m.dump = d.histogram("cairn_checkpoint_dump_seconds", "The slowest rank's prepare (lock, freeze, capture, dump) in a durable checkpoint.", roundBuckets, job)
	m.ingest = d.histogram("cairn_checkpoint_ingest_seconds", "t_write of a durable checkpoint: from the commit to every rank image stored.", roundBuckets, job)
	m.imageBytes = d.counter("cairn_checkpoint_image_bytes_total", "Bytes of the rank images of durable checkpoints.", job)
	m.newBytes = d.counter("cairn_checkpoint_new_bytes_total", "Bytes the stores of the ranks' nodes lacked, of durable checkpoints (what deduplication did not save).", job)
	m.lastImage = d.gauge("cairn_checkpoint_last_image_bytes", "Bytes of the rank images of the newest durable checkpoint.", job)
	m.lastNew = d.gauge("cairn_checkpoint_last_new_bytes", "Bytes of the newest durable checkpoint its nodes' stores lacked.", job)
	m.lastStall = d.gauge("cairn_checkpoint_last_stall_seconds", "How long the ranks stayed frozen in the newest durable checkpoint's round.", job)
	m.lastDurable = d.gauge("cairn_checkpoint_last_durable_number", "Number of the newest durable checkpoint.", job)
	m.lastDurableTime = d.gauge("cairn_checkpoint_last_durable_timestamp_seconds", "When the newest durable checkpoint became durable (Unix time).", job)
	m.lastProtected = d.gauge("cairn_checkpoint_last_protected_number", "Number of the newest protected checkpoint.", job)
	m.lastProtectedTime = d.gauge("cairn_checkpoint_last_protected_timestamp_seconds", "When the newest protected checkpoint became protected (Unix time).", job)

	m.rankDump = d.gauge("cairn_rank_checkpoint_dump_seconds", "The rank's prepare (lock, freeze, capture, dump) in the newest durable checkpoint.", job, rank)
	m.rankCRIU = d.gauge("cairn_rank_checkpoint_criu_seconds", "Of the rank's prepare, the dump by runc and CRIU, in the newest durable checkpoint.", job, rank)
	m.rankIngest = d.gauge("cairn_rank_checkpoint_ingest_seconds", "From the commit to the rank's image stored, in the newest durable checkpoint.", job, rank)
	m.rankImage = d.gauge("cairn_rank_checkpoint_image_bytes", "Bytes of the rank's image in the newest durable checkpoint.", job, rank)
	m.rankNew = d.gauge("cairn_rank_checkpoint_new_bytes", "Bytes of the rank's image in the newest durable checkpoint that its node's store lacked.", job, rank)

	m.copies = d.counter("cairn_replica_copies_total", "Rank images copied to another node.", job)
	m.copiedBytes = d.counter("cairn_replica_copied_bytes_total", "Bytes received by the nodes that copied rank images (only what they lacked).", job)
	m.copyTime = d.histogram("cairn_replica_copy_seconds", "How long a copy of a rank image took.", longBuckets, job)
	m.copyFails = d.counter("cairn_replica_failures_total", "Copies of rank images that failed.", job)
	m.repairs = d.counter("cairn_replica_repairs_total", "Damaged copies of rank images repaired from another copy.", job)
	m.lag = d.gauge("cairn_replication_lag_seconds", "How long the oldest durable checkpoint newer than the newest protected one has waited for its copies; 0: none waits.", job)
	m.pending = d.gauge("cairn_replication_pending_checkpoints", "Durable checkpoints newer than the newest protected one.", job)

	m.restarts = d.counter("cairn_job_restarts_total", "Restarts of the job from a checkpoint, automatic or asked for.", job)
	m.restartFails = d.counter("cairn_job_restart_failures_total", "Restarts of the job that failed.", job)
	m.restartTime = d.histogram("cairn_job_restart_seconds", "How long a restart took, from its start to every rank resumed.", longBuckets, job)

	m.migrations = d.counter("cairn_migrations_total", "Migrations of a rank, by result: done or failed (the job resumed where it was).", job, "result")
	m.migStall = d.histogram("cairn_migration_stall_seconds", "How long the job stayed frozen for a migration that was done.", longBuckets, job)
	m.migPhase = d.histogram("cairn_migration_phase_seconds", "The phases of migrations that were done: dump, move, restore, resume.", longBuckets, job, "phase")
	m.moved = d.counter("cairn_migration_moved_bytes_total", "Bytes of the images moved by migrations that were done.", job)

	m.nodeAlive = d.gauge("cairn_node_alive", "1 while the node's lease is alive, 0 once it is dead.", node)
	m.nodeHealthy = d.gauge("cairn_node_healthy", "1 if the node's last heartbeat reported no failing health probe.", node)
	m.nodeRanks = d.gauge("cairn_node_ranks", "Ranks placed on the node.", node)
	m.nodeSpare = d.gauge("cairn_node_spare", "1 if the node is a spare.", node)
	m.nodeDrained = d.gauge("cairn_node_drained", "1 if the node is drained.", node)
	m.nodeQuarantined = d.gauge("cairn_node_quarantined_packs", "Damaged packs the node's store set aside, as its last heartbeat reported.", node)
	m.nodeLost = d.counter("cairn_node_lost_total", "Times the node was declared dead.", node)
	m.nodeWarnings = d.counter("cairn_node_health_warnings_total", "Times a health probe of the node went bad.", node)
	if opts.Certs != nil {
		d.add(newCertCollector(opts.Certs, nil), certDef)
	}
	return m
}

// Defs returns every family of the coordinator's registry.
func (m *Coord) Defs() []Def { return m.defs.list }

// SetCatalog makes every scrape read the jobs and nodes from cat (at
// most once a second).
func (m *Coord) SetCatalog(cat Catalog) {
	m.gatherMu.Lock()
	defer m.gatherMu.Unlock()
	m.cat = cat
}

// job returns what is kept of a job; the caller holds mu.
func (m *Coord) job(name string) *jobMetrics {
	j := m.jobs[name]
	if j == nil {
		j = &jobMetrics{seen: m.opts.Now(), unprotected: map[int]time.Time{}}
		m.jobs[name] = j
	}
	return j
}

// Event takes an event of the coordinator's stream. live is false for
// the history a coordinator replays when it starts: such an event sets
// the gauges of the newest checkpoints, and counts nothing.
func (m *Coord) Event(e evv1.Event, live bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if live {
		m.events.WithLabelValues(e.Type).Inc()
	}
	if e.Node != "" {
		if _, ok := m.nodes[e.Node]; !ok {
			m.nodes[e.Node] = m.opts.Now()
		}
	}
	switch e.Type {
	case evv1.NodeLost:
		count(live, m.nodeLost, e.Node)
		m.nodeAlive.WithLabelValues(e.Node).Set(0)
	case evv1.HealthWarning:
		count(live, m.nodeWarnings, e.Node)
	}
	if e.Job == "" {
		return
	}
	job := e.Job
	j := m.job(job)
	switch e.Type {
	case evv1.CkptDurable:
		count(live, m.durable, job)
		if live {
			m.imageBytes.WithLabelValues(job).Add(float64(e.Bytes))
		}
		if e.Ckpt > j.protected {
			j.unprotected[e.Ckpt] = e.Time
		}
		if e.Ckpt >= j.durable {
			j.durable = e.Ckpt
			m.lastDurable.WithLabelValues(job).Set(float64(e.Ckpt))
			m.lastDurableTime.WithLabelValues(job).Set(unix(e.Time))
			m.lastImage.WithLabelValues(job).Set(float64(e.Bytes))
			m.lastStall.WithLabelValues(job).Set(e.Duration.Seconds())
		}
	case evv1.CkptProtected:
		count(live, m.protected, job)
		for seq := range j.unprotected {
			if seq <= e.Ckpt {
				delete(j.unprotected, seq)
			}
		}
		if e.Ckpt > j.protected {
			j.protected = e.Ckpt
			m.lastProtected.WithLabelValues(job).Set(float64(e.Ckpt))
			m.lastProtectedTime.WithLabelValues(job).Set(unix(e.Time))
		}
	case evv1.CkptAborted:
		if live {
			m.aborts.WithLabelValues(job, AbortReason(e.Message)).Inc()
		}
	case evv1.ReplicaCopied:
		if live {
			m.copies.WithLabelValues(job).Inc()
			m.copiedBytes.WithLabelValues(job).Add(float64(e.Bytes))
			m.copyTime.WithLabelValues(job).Observe(e.Duration.Seconds())
		}
	case evv1.ReplicaFailed:
		count(live, m.copyFails, job)
	case evv1.ReplicaRepaired:
		count(live, m.repairs, job)
	case evv1.JobRestarted:
		if live {
			m.restarts.WithLabelValues(job).Inc()
			m.restartTime.WithLabelValues(job).Observe(e.Duration.Seconds())
		}
	case evv1.JobRestartFailed:
		count(live, m.restartFails, job)
	case evv1.MigrationDone:
		if live {
			m.migrations.WithLabelValues(job, "done").Inc()
			m.migStall.WithLabelValues(job).Observe(e.Duration.Seconds())
			m.moved.WithLabelValues(job).Add(float64(e.Bytes))
		}
	case evv1.MigrationFailed:
		if live {
			m.migrations.WithLabelValues(job, "failed").Inc()
		}
	}
}

func count(live bool, v *prometheus.CounterVec, labels ...string) {
	if live {
		v.WithLabelValues(labels...).Inc()
	}
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Checkpoint takes the record of a durable checkpoint: the per-rank
// series, if it is the job's newest, and, if live (not read back by a
// restarted coordinator), the phases of its round.
func (m *Coord) Checkpoint(ck coordv1.Ckpt, live bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j := m.job(ck.Job)
	var added int64
	for _, r := range ck.Ranks {
		added += r.NewBytes
	}
	if live {
		m.stall.WithLabelValues(ck.Job).Observe(ck.Stall.Seconds())
		m.coordT.WithLabelValues(ck.Job).Observe(ck.Coord.Seconds())
		m.cont.WithLabelValues(ck.Job).Observe(ck.Cont.Seconds())
		m.dump.WithLabelValues(ck.Job).Observe(ck.MaxDump.Seconds())
		m.ingest.WithLabelValues(ck.Job).Observe(ck.Ingest.Seconds())
		m.newBytes.WithLabelValues(ck.Job).Add(float64(added))
	}
	if ck.Seq < j.durable {
		return
	}
	if j.checkpointSet {
		for _, v := range []*prometheus.GaugeVec{m.rankDump, m.rankCRIU, m.rankIngest, m.rankImage, m.rankNew} {
			v.DeletePartialMatch(prometheus.Labels{"job_name": ck.Job})
		}
	}
	j.checkpointSet = true
	m.lastNew.WithLabelValues(ck.Job).Set(float64(added))
	for _, r := range ck.Ranks {
		rank := strconv.Itoa(r.Rank)
		m.rankDump.WithLabelValues(ck.Job, rank).Set(r.Dump.Seconds())
		m.rankCRIU.WithLabelValues(ck.Job, rank).Set(r.CRIU.Seconds())
		m.rankIngest.WithLabelValues(ck.Job, rank).Set(r.Ingest.Seconds())
		m.rankImage.WithLabelValues(ck.Job, rank).Set(float64(r.Size))
		m.rankNew.WithLabelValues(ck.Job, rank).Set(float64(r.NewBytes))
	}
}

// Migration takes the record of a migration that ended: the phases of
// one that was done.
func (m *Coord) Migration(mig coordv1.Migration) {
	if mig.State != coordv1.MigrationDone {
		return
	}
	for phase, d := range map[string]time.Duration{"dump": mig.Dump, "move": mig.Move, "restore": mig.Restore, "resume": mig.Resume} {
		m.migPhase.WithLabelValues(mig.Job, phase).Observe(d.Seconds())
	}
}

// AbortReasons are the reasons cairn_checkpoint_aborts_total counts
// aborted rounds by.
var AbortReasons = []string{"deadline", "rank_lost", "rank_failed", "dump_timeout", "rank_damaged", "coordinator_restart", "other"}

var brokenRE = regexp.MustCompile(`^rank \d+ (lost|failed)\b`)

// AbortReason sorts the reason of an aborted round (the message of its
// checkpoint.aborted event) into one of AbortReasons.
func AbortReason(msg string) string {
	switch {
	case strings.Contains(msg, "deadline"):
		return "deadline"
	case strings.HasPrefix(msg, "coordinator restarted"):
		return "coordinator_restart"
	case strings.Contains(msg, "dump timed out"):
		return "dump_timeout"
	}
	m := brokenRE.FindStringSubmatch(msg)
	switch {
	case m == nil:
		return "other"
	case m[1] == "lost":
		return "rank_lost"
	case strings.Contains(msg, "damaged"):
		return "rank_damaged"
	}
	return "rank_failed"
}

// Gather reads the catalog (at most once a second), sets the gauges of
// jobs, nodes and replication, drops the series of jobs and nodes the
// catalog no longer has, and gathers the coordinator's registry and
// CoordOptions.Also.
func (m *Coord) Gather() ([]*dto.MetricFamily, error) {
	m.gatherMu.Lock()
	defer m.gatherMu.Unlock()
	if m.cat != nil && m.opts.Now().Sub(m.readAt) >= snapshotEvery {
		m.snapshot()
	}
	m.replication()
	gs := prometheus.Gatherers{m.defs.reg}
	if m.opts.Also != nil {
		gs = append(gs, m.opts.Also)
	}
	return gs.Gather()
}

// snapshot reads the jobs and nodes from the catalog; the caller holds
// gatherMu.
func (m *Coord) snapshot() {
	start := m.opts.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	jobs, err := m.cat.Jobs(ctx)
	if err != nil {
		return
	}
	nodes, err := m.cat.Nodes(ctx)
	if err != nil {
		return
	}
	m.readAt = start
	m.mu.Lock()
	defer m.mu.Unlock()
	byState := map[coordv1.JobState]int{}
	inCat := map[string]bool{}
	for _, j := range jobs {
		inCat[j.Name] = true
		m.job(j.Name)
		byState[j.State]++
		for _, s := range jobStates {
			m.jobState.WithLabelValues(j.Name, string(s)).Set(b2f(j.State == s))
		}
		m.jobRanks.WithLabelValues(j.Name).Set(float64(j.Ranks))
		m.jobReplicas.WithLabelValues(j.Name).Set(float64(j.Replicas))
		m.jobInterval.WithLabelValues(j.Name).Set(j.CheckpointEvery.Seconds())
	}
	for _, s := range jobStates {
		m.jobCount.WithLabelValues(string(s)).Set(float64(byState[s]))
	}
	// A job that started after the catalog was read keeps its series.
	for name, j := range m.jobs {
		if !inCat[name] && j.seen.Before(start) {
			m.forgetJob(name)
		}
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		seen[n.Name] = true
		if _, ok := m.nodes[n.Name]; !ok {
			m.nodes[n.Name] = start
		}
		m.nodeAlive.WithLabelValues(n.Name).Set(b2f(n.Alive))
		m.nodeHealthy.WithLabelValues(n.Name).Set(b2f(len(n.Health) == 0))
		m.nodeRanks.WithLabelValues(n.Name).Set(float64(n.Ranks))
		m.nodeSpare.WithLabelValues(n.Name).Set(b2f(n.Spare))
		m.nodeDrained.WithLabelValues(n.Name).Set(b2f(n.Drained))
		m.nodeQuarantined.WithLabelValues(n.Name).Set(float64(len(n.Quarantined)))
	}
	for name, at := range m.nodes {
		if !seen[name] && at.Before(start) {
			delete(m.nodes, name)
			for _, v := range m.nodeVecs() {
				v.DeletePartialMatch(prometheus.Labels{"node": name})
			}
		}
	}
}

// forgetJob drops every series of a removed job; the caller holds mu.
func (m *Coord) forgetJob(name string) {
	delete(m.jobs, name)
	for _, v := range m.jobVecs() {
		v.DeletePartialMatch(prometheus.Labels{"job_name": name})
	}
}

// partial is a vector whose series can be dropped by label.
type partial interface {
	DeletePartialMatch(prometheus.Labels) int
}

func (m *Coord) jobVecs() []partial {
	return []partial{m.jobState, m.jobRanks, m.jobReplicas, m.jobInterval,
		m.durable, m.protected, m.aborts, m.stall, m.coordT, m.cont, m.dump, m.ingest, m.imageBytes, m.newBytes,
		m.lastImage, m.lastNew, m.lastStall, m.lastDurable, m.lastDurableTime, m.lastProtected, m.lastProtectedTime,
		m.rankDump, m.rankCRIU, m.rankIngest, m.rankImage, m.rankNew,
		m.copies, m.copiedBytes, m.copyTime, m.copyFails, m.repairs, m.lag, m.pending,
		m.restarts, m.restartFails, m.restartTime, m.migrations, m.migStall, m.migPhase, m.moved}
}

func (m *Coord) nodeVecs() []partial {
	return []partial{m.nodeAlive, m.nodeHealthy, m.nodeRanks, m.nodeSpare, m.nodeDrained, m.nodeQuarantined, m.nodeLost, m.nodeWarnings}
}

// replication sets every job's replication lag as of now.
func (m *Coord) replication() {
	now := m.opts.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, j := range m.jobs {
		var oldest time.Time
		for _, at := range j.unprotected {
			if oldest.IsZero() || at.Before(oldest) {
				oldest = at
			}
		}
		lag := 0.0
		if !oldest.IsZero() {
			lag = max(0, now.Sub(oldest).Seconds())
		}
		m.lag.WithLabelValues(name).Set(lag)
		m.pending.WithLabelValues(name).Set(float64(len(j.unprotected)))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
