package machine

import (
	"fmt"
	"slices"
	"time"
)

// Phases of a restart, as the job's record holds them (with the ckpt, the
// new placement and the placement it replaces, from PhaseRestoring on).
const (
	// PhaseRestoring: the job is restarting; what is left of it is being
	// removed and its ranks restored, frozen, on their new nodes.
	PhaseRestoring Phase = "restoring"
	// PhaseResuming: every rank is restored, frozen and locked; they are
	// being resumed.
	PhaseResuming Phase = "resuming"
	// PhaseFailed: the restart failed; what it restored is removed. (Also
	// the phase a recovered job start that cannot finish ends in.)
	PhaseFailed Phase = "failed"
)

// RestartConfig describes a restart of a whole job from a ckpt.
type RestartConfig struct {
	Job       string
	Ckpt      int
	Placement []string // the node each rank is restored on
	// Leftover lists, by rank, the live nodes that may still hold a
	// container of the rank: where it ran before, and where a restart cut
	// short put it. They are removed first.
	Leftover [][]string
	// Copies lists, by rank, the live nodes with a complete copy of the
	// rank's image of the ckpt.
	Copies [][]string
	// Tier: the ckpt is in the job's durable tier, where a rank with no
	// copy comes from (fetched, or restored lazily from it).
	Tier bool
	// Lazy restores a rank whose node has no copy while it runs, its
	// memory coming from the copies (docs/lazy.md); otherwise the node
	// restores it from the copies' chunks as they arrive (RestoreRank
	// with Stream), and its store takes a copy afterwards, in the
	// background.
	Lazy bool
	// Drop lists the live nodes the job leaves: their job network goes
	// once the job runs.
	Drop []string
	// Recover is the phase the job was found in (PhaseRestoring or
	// PhaseResuming) when an earlier coordinator died during the restart;
	// "" for a new restart.
	Recover Phase
}

type restartPhase uint8

const (
	restartNew      restartPhase = iota
	restartRecord                // persisting restoring
	restartQuery                 // recovered resuming: are the ranks all there?
	restartClear                 // removing what is left of the job
	restartRestore               // fetching and restoring
	restartResuming              // persisting resuming
	restartHold                  // the failpoint before the resume
	restartResume                // resuming every node
	restartDrop                  // dropping the job network where the job left
	restartRunning               // persisting running
	restartUndo                  // the restart failed: removing what it restored
	restartFailed                // persisting failed
)

// Restart is the state machine of a whole-job restart from a ckpt:
//
//  1. record the job restarting (PhaseRestoring): the ckpt, the new
//     placement and the old one, so that whoever finishes the restart
//     knows what to remove;
//  2. remove what is left of the job, on live nodes (what cannot be
//     removed fails the restart: it may still run);
//  3. on every rank's node, fetch its image from its copies if the node
//     has none (or restore lazily from them), or from the durable tier if
//     no node has one, and restore it, frozen and
//     locked; a copy found damaged at restore is mended from another
//     copy and the restore tried once more; the holders that served
//     damage to a fetch are mended in the background;
//  4. record PhaseResuming, then resume every rank at once, one call per
//     node;
//  5. drop the job network from the nodes the job left and record the job
//     running (PhaseRunning).
//
// A failure before the resume ends (a rank that cannot be restored or
// resumed) removes every restored rank and records PhaseFailed.
//
// Recovered in PhaseRestoring, it starts again at 2 (with the cut-short
// restart's ranks among the leftovers). Recovered in PhaseResuming, it
// asks every rank's node for the rank: if all are there (frozen, or
// already resumed), it resumes them (4); otherwise it starts again at 1.
type Restart struct {
	core
	cfg      RestartConfig
	phase    restartPhase
	repaired []bool // a damaged copy of the rank was mended already
	failed   failures
	missing  bool // recovered in resuming: some rank is not there
}

// NewRestart returns the machine of the restart cfg describes.
func NewRestart(cfg RestartConfig) (*Restart, error) {
	n := len(cfg.Placement)
	if n == 0 {
		return nil, fmt.Errorf("restart job %s: no ranks", cfg.Job)
	}
	if len(cfg.Copies) != n || cfg.Leftover != nil && len(cfg.Leftover) != n {
		return nil, fmt.Errorf("restart job %s: %d ranks, %d copy lists, %d leftover lists", cfg.Job, n, len(cfg.Copies), len(cfg.Leftover))
	}
	for r, node := range cfg.Placement {
		if node == "" {
			return nil, fmt.Errorf("restart job %s: rank %d has no node", cfg.Job, r)
		}
		if len(cfg.Copies[r]) == 0 && !cfg.Tier {
			return nil, fmt.Errorf("restart job %s: rank %d has no copy of checkpoint %d", cfg.Job, r, cfg.Ckpt)
		}
	}
	switch cfg.Recover {
	case "", PhaseRestoring, PhaseResuming:
	default:
		return nil, fmt.Errorf("restart job %s: cannot recover from phase %q", cfg.Job, cfg.Recover)
	}
	return &Restart{cfg: cfg, repaired: make([]bool, n)}, nil
}

// Step advances the restart by one event; now is unused.
func (m *Restart) Step(_ time.Time, ev Event) ([]Action, error) {
	out, err := m.step(ev, m.phase != restartNew, m.start, m.result)
	if err != nil {
		return nil, fmt.Errorf("restart job %s: %w", m.cfg.Job, err)
	}
	return out, nil
}

func (m *Restart) start() {
	switch m.cfg.Recover {
	case PhaseRestoring:
		m.clear()
	case PhaseResuming:
		m.phase = restartQuery
		for r, n := range m.cfg.Placement {
			m.emit(QueryRank{Rank: r, Node: n})
		}
	default:
		m.record()
	}
}

func (m *Restart) record() {
	m.phase = restartRecord
	m.emit(Persist{Phase: PhaseRestoring})
}

// clear removes what is left of the job; a rank that is restored on a
// node that held it keeps its dir there.
func (m *Restart) clear() {
	m.phase = restartClear
	for r, nodes := range m.cfg.Leftover {
		for _, n := range nodes {
			m.emit(RemoveRank{Rank: r, Node: n, Keep: n == m.cfg.Placement[r]})
		}
	}
	if m.idle() {
		m.restore()
	}
}

func (m *Restart) restore() {
	m.phase = restartRestore
	for r, n := range m.cfg.Placement {
		switch {
		case slices.Contains(m.cfg.Copies[r], n):
			m.emit(RestoreRank{Rank: r, Node: n})
		case len(m.cfg.Copies[r]) == 0 && m.cfg.Lazy:
			m.emit(RestoreRank{Rank: r, Node: n, Tier: true})
		case len(m.cfg.Copies[r]) == 0:
			m.emit(FetchTier{Rank: r, Node: n})
		case m.cfg.Lazy:
			m.emit(RestoreRank{Rank: r, Node: n, Lazy: m.cfg.Copies[r]})
		default:
			m.emit(RestoreRank{Rank: r, Node: n, Stream: m.cfg.Copies[r]})
		}
	}
}

func (m *Restart) addFailure(format string, args ...any) {
	m.failed = append(m.failed, fmt.Errorf(format, args...))
}

func (m *Restart) result(res Result) {
	switch a := res.Action.(type) {
	case Persist:
		if res.Err != nil && a.Phase == PhaseRunning {
			m.fail(failures{fmt.Errorf("record the job running: %w", res.Err)})
			return
		}
		if res.Err != nil && a.Phase == PhaseFailed {
			m.fail(append(m.failed, fmt.Errorf("record the job failed: %w", res.Err)))
			return
		}
		if res.Err != nil {
			m.addFailure("record the job %s: %w", a.Phase, res.Err)
		}
	case QueryRank:
		if res.Err != nil || res.Status != "paused" && res.Status != "running" {
			m.missing = true
		}
	case FetchTier:
		if res.Err != nil {
			m.addFailure("rank %d: fetch to %s from the durable tier: %w", a.Rank, a.Node, res.Err)
			break
		}
		m.emit(RestoreRank{Rank: a.Rank, Node: a.Node})
	case RestoreRank:
		switch {
		case res.Err == nil && len(a.Stream) > 0:
			// The holders that served damage are repaired from the
			// others, and the node's store takes its copy, while the job
			// runs.
			good := slices.DeleteFunc(slices.Clone(a.Stream), func(n string) bool { return slices.Contains(res.Damaged, n) })
			for _, d := range res.Damaged {
				if len(good) > 0 {
					m.emit(RepairCopy{Rank: a.Rank, Node: d, From: good, Background: true})
				}
			}
			if len(good) == 0 {
				good = a.Stream
			}
			m.emit(FetchImage{Rank: a.Rank, Node: a.Node, From: good, Background: true})
		case res.Err == nil:
		case res.Corrupt && len(a.Stream) == 0 && !m.repaired[a.Rank] && len(m.others(a.Rank)) > 0:
			m.repaired[a.Rank] = true
			m.emit(RepairCopy{Rank: a.Rank, Node: a.Node, From: m.others(a.Rank)})
		default:
			m.addFailure("rank %d: restore on %s: %w", a.Rank, a.Node, res.Err)
		}
	case RepairCopy:
		if res.Err != nil {
			m.addFailure("rank %d: its copy on %s is damaged and could not be mended: %w", a.Rank, a.Node, res.Err)
			break
		}
		m.emit(RestoreRank{Rank: a.Rank, Node: a.Node})
	case ResumeRanks:
		if res.Err != nil && !m.again(a) {
			m.addFailure("resume on %s: %w", a.Node, res.Err)
		}
	case RemoveRank:
		// Removing a rank that is gone succeeds: a removal whose reply
		// was lost is sent again. What is left of the job and cannot be
		// removed may still run: restoring the rank elsewhere would run
		// it twice, so the restart fails. (A restored rank the undo
		// cannot remove stays frozen; the node's next heartbeat lists it
		// and the coordinator drops it.)
		if res.Err != nil && !m.again(a) && m.phase == restartClear {
			m.addFailure("rank %d: what is left of it on %s cannot be removed: %w", a.Rank, a.Node, res.Err)
		}
	}
	if !m.idle() {
		return
	}
	m.next()
}

// others are the copies of rank r's image other than on its new node.
func (m *Restart) others(r int) []string {
	var out []string
	for _, n := range m.cfg.Copies[r] {
		if n != m.cfg.Placement[r] {
			out = append(out, n)
		}
	}
	return out
}

func (m *Restart) next() {
	if len(m.failed) > 0 && m.phase < restartUndo {
		switch m.phase {
		case restartRecord:
			m.fail(m.failed) // nothing was done
			return
		case restartClear:
			m.phase = restartUndo // nothing restored yet: record it failed
		default:
			m.phase = restartUndo
			for r, n := range m.cfg.Placement {
				m.emit(RemoveRank{Rank: r, Node: n})
			}
			return
		}
	}
	switch m.phase {
	case restartRecord:
		m.clear()
	case restartQuery:
		if m.missing {
			// Not every rank is there to resume: restart them all.
			m.cfg.Leftover = leftovers(m.cfg.Leftover, m.cfg.Placement)
			m.record()
			return
		}
		m.resume()
	case restartClear:
		m.restore()
	case restartRestore:
		m.phase = restartResuming
		m.emit(Persist{Phase: PhaseResuming})
	case restartResuming:
		m.phase = restartHold
		m.emit(Failpoint{Name: "restart-before-resume"})
	case restartHold:
		m.resume()
	case restartResume:
		m.phase = restartDrop
		for _, n := range m.cfg.Drop {
			m.emit(DropJobNet{Node: n})
		}
		if m.idle() {
			m.next()
		}
	case restartDrop:
		m.phase = restartRunning
		m.emit(Persist{Phase: PhaseRunning})
	case restartRunning:
		m.finish(true, "")
	case restartUndo:
		m.phase = restartFailed
		m.emit(Persist{Phase: PhaseFailed, Reason: m.failed.Error()})
	case restartFailed:
		m.fail(m.failed)
	}
}

func (m *Restart) resume() {
	m.phase = restartResume
	nodes, ranks := byNode(m.cfg.Placement, nil)
	for _, n := range nodes {
		m.emit(ResumeRanks{Node: n, Ranks: ranks[n]})
	}
}

// leftovers adds each rank's node in placement to its leftover nodes.
func leftovers(left [][]string, placement []string) [][]string {
	out := make([][]string, len(placement))
	for r, n := range placement {
		if r < len(left) {
			out[r] = slices.Clone(left[r])
		}
		if !slices.Contains(out[r], n) {
			out[r] = append(out[r], n)
		}
	}
	return out
}
