// Package policy decides what the coordinator does on its own: which
// protocol follows what happened to a job or a node. A durable checkpoint
// is replicated (and the job's automatic interval reviewed); once it is
// protected, it is flushed to the job's durable tier if it is one of
// those the job flushes, and a job that keeps only its newest checkpoints
// has the older ones removed; a job that
// lost a node, or one of whose ranks a dump left damaged, is restarted by
// its failure policy, or marked lost or failed; an automatic restart that
// fails is tried again a node lease later, or as soon as a node is found
// dead, and given up after the last attempt; a node that turns unwell has
// its jobs' ranks moved away or a checkpoint taken, by each job's policy;
// periodic rounds fall due; a job whose ranks ended is settled.
//
// Like coord/round and coord/machine it is a pure machine: Step takes
// what happened (an Event) with a Snapshot of the jobs and the nodes
// taken for that decision, and returns Actions for the coordinator's
// supervisor to perform. The protocols it starts never start another one:
// their outcomes come back to it as Events. It does no I/O and reads no
// clock, so its decisions are tested as scripted traces
// (testdata/*.txt).
package policy

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config tunes a Machine.
type Config struct {
	// Attempts is how often an automatic restart (after a node loss, a
	// damaged rank, or one an earlier coordinator left), or an incomplete
	// replication, is tried; 0 means 5.
	Attempts int
	// RetryAfter is the wait between two attempts: nodes that die
	// together are seen dead one node lease apart, and the nodes of a
	// new coordinator join it one by one.
	RetryAfter time.Duration
}

// Health is what a job does when a node of its turns unwell.
type Health uint8

const (
	HealthNone       Health = iota // nothing
	HealthMigrate                  // its ranks there move away
	HealthCheckpoint               // a checkpoint is taken now
)

// Job is a job as a decision sees it.
type Job struct {
	Name      string
	Running   bool     // its state is running
	Placement []string // the node of each rank
	// MayRestart: its failure policy lets it restart once more.
	MayRestart bool
	OnHealth   Health
	// Every is the interval of its periodic rounds (0: none).
	Every time.Duration
	// NeedsInterval: its interval is automatic and not chosen yet.
	NeedsInterval bool
	// Auto: its interval is automatic (reviewed after each durable round).
	Auto bool
	// Keep is how many of its newest protected checkpoints it keeps (0:
	// all); the others but the pinned ones go once a new one is
	// protected.
	Keep int
	// FlushEvery: every such checkpoint (by number) is flushed to the
	// job's durable tier once protected (0: none).
	FlushEvery int
}

// Snapshot is what a decision is taken on, read once for it.
type Snapshot struct {
	Now  time.Time
	Jobs []Job
	Live map[string]bool // the live nodes
}

func (s Snapshot) job(name string) (Job, bool) {
	for _, j := range s.Jobs {
		if j.Name == name {
			return j, true
		}
	}
	return Job{}, false
}

// lost reports whether a rank of j is on a node that is not live.
func (s Snapshot) lost(j Job) bool {
	for _, n := range j.Placement {
		if !s.Live[n] {
			return true
		}
	}
	return false
}

// Cause says why an automatic restart runs.
type Cause uint8

const (
	// CauseLost: a node of the job died. The restart does nothing if
	// every rank's node is alive by then (nodes dying together each
	// cause one; the first restarts).
	CauseLost Cause = iota
	// CauseDamaged: a dump left a rank unusable; the job restarts from
	// its newest restorable checkpoint.
	CauseDamaged
	// CauseLeft: an earlier coordinator died during the job's restart.
	CauseLeft
	// CauseAsked: a user asked for the restart. The policy hears of such
	// a restart only when it failed (RestartEnded), and never starts one.
	CauseAsked
	// CauseRetry: a restart a user asked for failed (a node may have died
	// or been cut off during it); the job's policy restarts it, unless it
	// runs by then.
	CauseRetry
)

func (c Cause) String() string {
	switch c {
	case CauseLost:
		return "lost"
	case CauseDamaged:
		return "damaged"
	case CauseAsked:
		return "asked"
	case CauseRetry:
		return "retry"
	}
	return "left"
}

// Events: what happened. The protocols' outcomes are among them.
type (
	// Tick is the passing of time: periodic rounds and retries fall due.
	Tick struct{}
	// NodeLost: a node's lease expired. Node "" stands for every node not
	// alive, when a coordinator takes over.
	NodeLost struct{ Node string }
	// NodeUnwell: a node's health probes turned from passing to failing.
	NodeUnwell struct{ Node string }
	// Started: a round of the job began (any round: asked for by a user,
	// a rank, or periodic), or the job started or restarted: its periodic
	// rounds count from now.
	Started struct{ Job string }
	// RoundEnded: a round of the job ended. Damaged, if set, says why a
	// rank was left unusable by its dump.
	RoundEnded struct {
		Job      string
		Seq      int
		Periodic bool
		Durable  bool
		Damaged  string
	}
	// CheckpointEnded: a Checkpoint action ended, whether its round ran
	// or never began (the job was busy, or no longer running). A periodic
	// round is asked for again only after it: rounds never overlap, and
	// one refused does not stop those that follow.
	CheckpointEnded struct{ Job string }
	// MigrationEnded: a migration of the job's rank ended; Damaged as in
	// RoundEnded.
	MigrationEnded struct {
		Job     string
		Rank    int
		Damaged string
	}
	// RestartEnded: an automatic restart ended; Err is "" if it
	// succeeded.
	RestartEnded struct {
		Job     string
		Cause   Cause
		Attempt int
		Err     string
	}
	// RanksEnded: a node reported ranks of the job ended.
	RanksEnded struct{ Job string }
	// RankEndedByNode: settling the job found a rank its node ended, not
	// its program (its lazy restore's pages could not be fetched, its
	// agent having died): a failure of the node's, restarted by the job's
	// failure policy as a damaged rank is.
	RankEndedByNode struct {
		Job    string
		Reason string
	}
	// IntervalReviewed: the job's automatic interval was reviewed.
	IntervalReviewed struct{ Job string }
	// ReplicateEnded: a Replicate action ended; Incomplete says a copy
	// could not be made (its receiver or every holder failed, or was cut
	// off). One incomplete is tried again a retry later, up to Attempts
	// times: the node may be back by then, and nothing else would make
	// the copy until a node is lost.
	ReplicateEnded struct {
		Job        string
		Seq        int
		Incomplete bool
	}
	// Left: what an earlier coordinator left, found when this one takes
	// over: a restart (Seq 0) or a durable checkpoint Seq that may lack
	// copies.
	Left struct {
		Job string
		Seq int
	}
)

// Event is an input to Step.
type Event interface {
	fmt.Stringer
	isEvent()
}

func (Tick) isEvent()             {}
func (NodeLost) isEvent()         {}
func (NodeUnwell) isEvent()       {}
func (Started) isEvent()          {}
func (RoundEnded) isEvent()       {}
func (CheckpointEnded) isEvent()  {}
func (MigrationEnded) isEvent()   {}
func (RestartEnded) isEvent()     {}
func (RanksEnded) isEvent()       {}
func (RankEndedByNode) isEvent()  {}
func (IntervalReviewed) isEvent() {}
func (ReplicateEnded) isEvent()   {}
func (Left) isEvent()             {}

func (Tick) String() string { return "tick" }
func (e NodeLost) String() string {
	if e.Node == "" {
		return "node-lost every dead node"
	}
	return "node-lost " + e.Node
}
func (e NodeUnwell) String() string { return "node-unwell " + e.Node }
func (e Started) String() string    { return "started " + e.Job }
func (e CheckpointEnded) String() string {
	return "checkpoint-ended " + e.Job
}
func (e RoundEnded) String() string {
	s := fmt.Sprintf("round-ended %s:%d", e.Job, e.Seq)
	if e.Durable {
		s += " durable"
	}
	if e.Periodic {
		s += " periodic"
	}
	if e.Damaged != "" {
		s += " damaged=" + strconv.Quote(e.Damaged)
	}
	return s
}
func (e MigrationEnded) String() string {
	s := fmt.Sprintf("migration-ended %s/%d", e.Job, e.Rank)
	if e.Damaged != "" {
		s += " damaged=" + strconv.Quote(e.Damaged)
	}
	return s
}
func (e RestartEnded) String() string {
	s := fmt.Sprintf("restart-ended %s cause=%s attempt=%d", e.Job, e.Cause, e.Attempt)
	if e.Err != "" {
		s += " err=" + strconv.Quote(e.Err)
	}
	return s
}
func (e RanksEnded) String() string { return "ranks-ended " + e.Job }
func (e RankEndedByNode) String() string {
	return "rank-ended-by-node " + e.Job + " reason=" + strconv.Quote(e.Reason)
}
func (e IntervalReviewed) String() string { return "interval-reviewed " + e.Job }
func (e ReplicateEnded) String() string {
	s := fmt.Sprintf("replicate-ended %s:%d", e.Job, e.Seq)
	if e.Incomplete {
		s += " incomplete"
	}
	return s
}
func (e Left) String() string {
	if e.Seq == 0 {
		return "left restart " + e.Job
	}
	return fmt.Sprintf("left checkpoint %s:%d", e.Job, e.Seq)
}

// Actions: what the supervisor does next.
type (
	// Checkpoint takes a round of the job (Periodic: skipped if the job
	// is busy).
	Checkpoint struct {
		Job      string
		Periodic bool
		Why      string
	}
	// Replicate brings the checkpoint's copies to the job's count.
	Replicate struct {
		Job string
		Seq int
	}
	// ReviewInterval chooses the job's automatic interval again.
	ReviewInterval struct{ Job string }
	// Restart restarts the job from its newest restorable checkpoint.
	Restart struct {
		Job     string
		Cause   Cause
		Attempt int
	}
	// MarkLost records that the job lost a node and may not restart.
	MarkLost struct{ Job string }
	// MarkFailed records that a rank of the job is damaged and the job
	// may not restart.
	MarkFailed struct{ Job, Reason string }
	// GiveUp records that the job's automatic restart gave up.
	GiveUp struct{ Job, Reason string }
	// Repair re-creates the copies that dead nodes took with them.
	Repair struct{}
	// MoveAway migrates the job's ranks off an unwell node, one after
	// another.
	MoveAway struct {
		Job   string
		Node  string
		Ranks []int
	}
	// Settle sets the job's state by how its ranks stand.
	Settle struct{ Job string }
	// Retain removes the job's checkpoints beyond its Keep newest
	// protected ones (and the pinned ones).
	Retain struct{ Job string }
	// Flush flushes the checkpoint to the job's durable tier.
	Flush struct {
		Job string
		Seq int
	}
)

// Action is an output of Step.
type Action interface {
	fmt.Stringer
	isAction()
}

func (Checkpoint) isAction()     {}
func (Replicate) isAction()      {}
func (ReviewInterval) isAction() {}
func (Restart) isAction()        {}
func (MarkLost) isAction()       {}
func (MarkFailed) isAction()     {}
func (GiveUp) isAction()         {}
func (Repair) isAction()         {}
func (MoveAway) isAction()       {}
func (Settle) isAction()         {}
func (Retain) isAction()         {}
func (Flush) isAction()          {}

func (a Checkpoint) String() string {
	s := "checkpoint " + a.Job
	if a.Periodic {
		s += " periodic"
	}
	if a.Why != "" {
		s += " (" + a.Why + ")"
	}
	return s
}
func (a Replicate) String() string      { return fmt.Sprintf("replicate %s:%d", a.Job, a.Seq) }
func (a ReviewInterval) String() string { return "review-interval " + a.Job }
func (a Restart) String() string {
	return fmt.Sprintf("restart %s cause=%s attempt=%d", a.Job, a.Cause, a.Attempt)
}
func (a MarkLost) String() string   { return "mark-lost " + a.Job }
func (a MarkFailed) String() string { return "mark-failed " + a.Job + " " + strconv.Quote(a.Reason) }
func (a GiveUp) String() string     { return "give-up " + a.Job + " " + strconv.Quote(a.Reason) }
func (Repair) String() string       { return "repair" }
func (a MoveAway) String() string {
	rs := make([]string, len(a.Ranks))
	for i, r := range a.Ranks {
		rs[i] = strconv.Itoa(r)
	}
	return fmt.Sprintf("move-away %s ranks=%s from=%s", a.Job, strings.Join(rs, ","), a.Node)
}
func (a Settle) String() string { return "settle " + a.Job }
func (a Retain) String() string { return "retain " + a.Job }
func (a Flush) String() string  { return fmt.Sprintf("flush %s:%d", a.Job, a.Seq) }

// Machine is the policy's state: when each job's last round began, which
// reactions are under way, and the restarts waiting for their next
// attempt.
type Machine struct {
	cfg Config
	// lastRound is when each job's last round began, for its periodic
	// rounds; a job seen with an interval for the first time counts from
	// then.
	lastRound map[string]time.Time
	// inRound: a periodic round this machine asked for has not ended
	// (no CheckpointEnded yet).
	inRound map[string]bool
	// restarting: an automatic restart of the job is under way, or waits
	// for its next attempt.
	restarting map[string]*pending
	// reviewing: when an interval review was last asked for, by job.
	reviewing map[string]time.Time
	// copying: the checkpoints whose copies are tried again, each under
	// way (at zero) or waiting for its next attempt.
	copying map[ckpt]*pending
}

// ckpt names a checkpoint of a job.
type ckpt struct {
	job string
	seq int
}

// pending is an automatic restart under way (at zero) or waiting for its
// next attempt at at.
type pending struct {
	cause   Cause
	attempt int
	at      time.Time
	why     string // the damage that caused it (CauseDamaged)
	// then: a rank was found damaged while it ran; a restart for that
	// follows it (the one under way may have found nothing to do).
	then string
	// lost: a node was found dead while the attempt under way ran; if it
	// fails, the next one starts at once.
	lost bool
}

// New returns a Machine.
func New(cfg Config) *Machine {
	if cfg.Attempts <= 0 {
		cfg.Attempts = 5
	}
	return &Machine{cfg: cfg, lastRound: map[string]time.Time{}, inRound: map[string]bool{},
		restarting: map[string]*pending{}, reviewing: map[string]time.Time{}, copying: map[ckpt]*pending{}}
}

// Step decides what follows ev, on s.
func (m *Machine) Step(s Snapshot, ev Event) []Action {
	switch ev := ev.(type) {
	case Tick:
		return m.tick(s)
	case NodeLost:
		return m.nodeLost(s)
	case NodeUnwell:
		return m.nodeUnwell(s, ev.Node)
	case Started:
		m.lastRound[ev.Job] = s.Now
		if p := m.restarting[ev.Job]; p != nil && p.cause == CauseRetry && !p.at.IsZero() {
			delete(m.restarting, ev.Job) // restarted meanwhile (by a user)
		}
	case CheckpointEnded:
		delete(m.inRound, ev.Job)
	case RoundEnded:
		var out []Action
		if ev.Durable {
			out = append(out, Replicate{Job: ev.Job, Seq: ev.Seq})
			if j, ok := s.job(ev.Job); ok && j.Auto {
				out = append(out, ReviewInterval{Job: ev.Job})
			}
		}
		if ev.Damaged != "" {
			return append(out, m.damaged(s, ev.Job, ev.Damaged)...)
		}
		if ev.Periodic && !ev.Durable {
			out = append(out, Settle{Job: ev.Job}) // its ranks may have ended
		}
		return out
	case MigrationEnded:
		if ev.Damaged != "" {
			return m.damaged(s, ev.Job, ev.Damaged)
		}
	case RestartEnded:
		return m.restartEnded(s, ev)
	case RanksEnded:
		if j, ok := s.job(ev.Job); ok && j.Running {
			return []Action{Settle{Job: ev.Job}}
		}
	case RankEndedByNode:
		if j, ok := s.job(ev.Job); ok && j.Running {
			return m.damaged(s, ev.Job, ev.Reason)
		}
	case ReplicateEnded:
		return m.replicateEnded(s, ev)
	case IntervalReviewed:
		// reviewing keeps the time: a job still without an interval (no
		// MTBF yet) is reviewed again a retry later.
	case Left:
		if ev.Seq > 0 {
			return []Action{Replicate{Job: ev.Job, Seq: ev.Seq}}
		}
		return m.restart(ev.Job, CauseLeft, 1)
	}
	return nil
}

// tick starts the periodic rounds and the restart attempts that are due,
// and forgets the jobs that are gone.
func (m *Machine) tick(s Snapshot) []Action {
	var out []Action
	names := map[string]bool{}
	for _, j := range s.Jobs {
		names[j.Name] = true
		if !j.Running {
			continue
		}
		if j.NeedsInterval {
			if at, ok := m.reviewing[j.Name]; !ok || s.Now.Sub(at) >= m.cfg.RetryAfter {
				m.reviewing[j.Name] = s.Now
				out = append(out, ReviewInterval{Job: j.Name})
			}
			continue
		}
		if j.Every <= 0 {
			continue
		}
		last, ok := m.lastRound[j.Name]
		if !ok {
			m.lastRound[j.Name] = s.Now
			continue
		}
		if m.inRound[j.Name] || s.Now.Sub(last) < j.Every {
			continue
		}
		m.lastRound[j.Name], m.inRound[j.Name] = s.Now, true
		out = append(out, Checkpoint{Job: j.Name, Periodic: true})
	}
	for _, name := range sortedKeys(m.restarting) {
		p := m.restarting[name]
		if !p.at.IsZero() && !s.Now.Before(p.at) {
			p.at, p.lost = time.Time{}, false
			out = append(out, Restart{Job: name, Cause: p.cause, Attempt: p.attempt})
		}
	}
	for _, k := range sortedCkpts(m.copying) {
		p := m.copying[k]
		switch {
		case !names[k.job]:
			delete(m.copying, k)
		case !p.at.IsZero() && !s.Now.Before(p.at):
			p.at = time.Time{}
			out = append(out, Replicate{Job: k.job, Seq: k.seq})
		}
	}
	for _, st := range []map[string]time.Time{m.lastRound, m.reviewing} {
		for name := range st {
			if !names[name] {
				delete(st, name)
			}
		}
	}
	for name := range m.inRound {
		if !names[name] {
			delete(m.inRound, name)
		}
	}
	return out
}

// nodeLost restarts, or marks lost, by its policy each running job with a
// rank on a node not alive, and repairs the checkpoints. A restart waiting
// for its next attempt is tried now, and one under way is tried again at
// once if it fails: what made it fail was most likely this node, alive to
// the last attempt (it chose it, or had to reach it to stop what ran
// there) and now seen dead, which the next attempt does without. Waiting
// a lease more would leave the job down for nothing.
func (m *Machine) nodeLost(s Snapshot) []Action {
	var out []Action
	for _, name := range sortedKeys(m.restarting) {
		p := m.restarting[name]
		if p.at.IsZero() {
			p.lost = true
			continue
		}
		p.at, p.lost = time.Time{}, false
		out = append(out, Restart{Job: name, Cause: p.cause, Attempt: p.attempt})
	}
	for _, j := range s.Jobs {
		if !j.Running || !s.lost(j) {
			continue
		}
		if !j.MayRestart {
			out = append(out, MarkLost{Job: j.Name})
			continue
		}
		out = append(out, m.restart(j.Name, CauseLost, 1)...)
	}
	return append(out, Repair{})
}

// restart starts an automatic restart of job, unless one is under way
// (or waits for its next attempt): that one does what this would.
func (m *Machine) restart(job string, cause Cause, attempt int) []Action {
	if _, ok := m.restarting[job]; ok {
		return nil
	}
	m.restarting[job] = &pending{cause: cause, attempt: attempt}
	return []Action{Restart{Job: job, Cause: cause, Attempt: attempt}}
}

// damaged restarts a job with a damaged rank by its failure policy, or
// marks it failed.
func (m *Machine) damaged(s Snapshot, job, reason string) []Action {
	j, ok := s.job(job)
	if !ok {
		return nil
	}
	if !j.MayRestart {
		return []Action{MarkFailed{Job: job, Reason: "a rank is damaged: " + reason}}
	}
	if p, ok := m.restarting[job]; ok {
		if p.cause != CauseDamaged && p.then == "" {
			p.then = reason
		}
		return nil
	}
	out := m.restart(job, CauseDamaged, 1)
	m.restarting[job].why = reason
	return out
}

// restartEnded decides what follows an automatic restart: another attempt
// a retry later, or giving up; after a success, another restart if a
// node of the job died meanwhile.
func (m *Machine) restartEnded(s Snapshot, ev RestartEnded) []Action {
	p := m.restarting[ev.Job]
	if ev.Cause == CauseAsked {
		// A user's restart failed, perhaps for a node that died or was
		// cut off during it: the job's policy restarts it a retry later,
		// unless an automatic restart is under way or waits already.
		if j, ok := s.job(ev.Job); ok && p == nil && ev.Err != "" && j.MayRestart {
			m.restarting[ev.Job] = &pending{cause: CauseRetry, attempt: 1, at: s.Now.Add(m.cfg.RetryAfter)}
		}
		return nil
	}
	if p == nil {
		return nil
	}
	var out []Action
	switch {
	case ev.Err == "":
		delete(m.restarting, ev.Job)
		if j, ok := s.job(ev.Job); ok && j.Running && s.lost(j) {
			// A node of the job died while it restarted.
			out = m.nodeLost(Snapshot{Now: s.Now, Live: s.Live, Jobs: []Job{j}})
			out = out[:len(out)-1] // the first loss's repair covers it
		}
		if p.then != "" && m.restarting[ev.Job] == nil {
			out = append(out, m.damaged(s, ev.Job, p.then)...)
		}
	case ev.Attempt >= m.cfg.Attempts:
		delete(m.restarting, ev.Job)
		err := ev.Err
		if p.cause == CauseDamaged {
			err = fmt.Sprintf("a rank is damaged (%s), and its restart failed: %s", p.why, ev.Err)
		}
		out = []Action{GiveUp{Job: ev.Job, Reason: "automatic restart gave up: " + err}}
	case p.lost:
		// A node was found dead while it ran: try again without it.
		p.attempt, p.lost = ev.Attempt+1, false
		out = []Action{Restart{Job: ev.Job, Cause: p.cause, Attempt: p.attempt}}
	default:
		p.attempt, p.at = ev.Attempt+1, s.Now.Add(m.cfg.RetryAfter)
	}
	return out
}

// replicateEnded tries an incomplete replication again a retry later, up
// to Attempts times in all; after that the next node loss's repair makes
// the copies.
func (m *Machine) replicateEnded(s Snapshot, ev ReplicateEnded) []Action {
	k := ckpt{ev.Job, ev.Seq}
	p := m.copying[k]
	j, ok := s.job(ev.Job)
	if !ok || !ev.Incomplete {
		delete(m.copying, k)
		// The checkpoint is protected: flushed if it is one of those,
		// then one more for retention to count.
		var out []Action
		if ok && j.FlushEvery > 0 && ev.Seq%j.FlushEvery == 0 {
			out = append(out, Flush{Job: ev.Job, Seq: ev.Seq})
		}
		if ok && j.Keep > 0 {
			out = append(out, Retain{Job: ev.Job})
		}
		return out
	}
	if p == nil {
		p = &pending{attempt: 1}
		m.copying[k] = p
	}
	if p.attempt >= m.cfg.Attempts {
		delete(m.copying, k)
		return nil
	}
	p.attempt, p.at = p.attempt+1, s.Now.Add(m.cfg.RetryAfter)
	return nil
}

// nodeUnwell acts, by each job's policy, on a node turning unwell.
func (m *Machine) nodeUnwell(s Snapshot, node string) []Action {
	var out []Action
	for _, j := range s.Jobs {
		if !j.Running || !slices.Contains(j.Placement, node) {
			continue
		}
		switch j.OnHealth {
		case HealthMigrate:
			mv := MoveAway{Job: j.Name, Node: node}
			for r, on := range j.Placement {
				if on == node {
					mv.Ranks = append(mv.Ranks, r)
				}
			}
			out = append(out, mv)
		case HealthCheckpoint:
			out = append(out, Checkpoint{Job: j.Name, Why: "node " + node + " unwell"})
		}
	}
	return out
}

func sortedCkpts(m map[ckpt]*pending) []ckpt {
	out := make([]ckpt, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].job != out[b].job {
			return out[a].job < out[b].job
		}
		return out[a].seq < out[b].seq
	})
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
