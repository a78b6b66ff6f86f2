package machine

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Phases of a migration. Its record is created running before the machine
// runs; PhasePlaced and PhaseUnplaced write the job's placement, PhaseDone
// and PhaseFailed the migration's record.
const (
	// PhasePlaced: the job's record places the rank on its target. This
	// is the migration's commit point: a coordinator that dies from here
	// on is followed by one that finishes the migration.
	PhasePlaced Phase = "placed"
	// PhaseUnplaced: the job's record places the rank on its source again
	// (removing the source's copy failed after PhasePlaced).
	PhaseUnplaced Phase = "unplaced"
	// PhaseDone: the rank runs on its target; the migration is recorded
	// done.
	PhaseDone Phase = "done"
)

// MigrationConfig describes the move of one rank to another node.
type MigrationConfig struct {
	Job       string
	Rank      int
	From, To  string
	Placement []string // the job's placement before the move
	// Recover: the migration was found running, an earlier coordinator
	// having died during it; Placed: the job's record already places the
	// rank on To; FromLost: From is dead (nothing of the rank is left
	// there to remove).
	Recover, Placed, FromLost bool
}

type migPhase uint8

const (
	migNew     migPhase = iota
	migStall            // the others stalled, the rank prepared on its node
	migMove             // the target pulls the image and restores it
	migPlace            // persisting placed
	migHold1            // failpoint migration-before-remove
	migOut              // the source's copy removed, job networks pointed
	migHold2            // failpoint migration-before-resume
	migResume           // every rank resumed
	migDrop             // the source's job network dropped
	migDone             // persisting done
	migUnplace          // persisting unplaced
	migUndo1            // undo: the target's copy removed, networks pointed back
	migUndo2            // undo: the rank's prepare aborted, the others resumed
	migFailed           // persisting failed
)

// Migration is the state machine of a live migration of one rank while the
// rest of its job waits:
//
//  1. stall: every other rank is locked and frozen where it is, and the
//     moving rank is prepared on its node as for a checkpoint (locked,
//     frozen, dumped into staging);
//  2. move: the target pulls the staged image and restores the rank,
//     frozen and locked, with its address;
//  3. place: the job's record places the rank on the target (PhasePlaced,
//     the commit point);
//  4. the source's copy is removed and every node's job network points at
//     the rank's new node; then every rank resumes, the source's job
//     network goes if no rank is left there, and the migration is recorded
//     done.
//
// A failure before 3 ends (or of the removal in 4, after the placement is
// put back) undoes the migration: the target's copy is removed, the job
// networks point at the rank's own node again, the rank's prepare is
// aborted and every rank resumes where it was; the migration is recorded
// failed. Failures after the removal are noted in the done record.
//
// Recovered placed, it finishes 4; recovered not placed, it undoes.
type Migration struct {
	core
	cfg    MigrationConfig
	moved  []string // the placement after the move
	phase  migPhase
	failed failures
	noted  []string // failures that do not undo the move
	// recovered: an earlier coordinator died after the commit point;
	// the done record says who finished it.
	recovered bool
}

// NewMigration returns the machine of the migration cfg describes.
func NewMigration(cfg MigrationConfig) (*Migration, error) {
	if cfg.Rank < 0 || cfg.Rank >= len(cfg.Placement) {
		return nil, fmt.Errorf("migrate job %s: no rank %d", cfg.Job, cfg.Rank)
	}
	if cfg.From == "" || cfg.To == "" || cfg.From == cfg.To {
		return nil, fmt.Errorf("migrate job %s rank %d: from %q to %q", cfg.Job, cfg.Rank, cfg.From, cfg.To)
	}
	if cfg.Placement[cfg.Rank] != cfg.From {
		return nil, fmt.Errorf("migrate job %s rank %d: it is on %s, not %s", cfg.Job, cfg.Rank, cfg.Placement[cfg.Rank], cfg.From)
	}
	moved := slices.Clone(cfg.Placement)
	moved[cfg.Rank] = cfg.To
	return &Migration{cfg: cfg, moved: moved}, nil
}

// Step advances the migration by one event; now is unused.
func (m *Migration) Step(_ time.Time, ev Event) ([]Action, error) {
	out, err := m.step(ev, m.phase != migNew, m.start, m.result)
	if err != nil {
		return nil, fmt.Errorf("migrate job %s rank %d: %w", m.cfg.Job, m.cfg.Rank, err)
	}
	return out, nil
}

func (m *Migration) start() {
	switch {
	case m.cfg.Recover && m.cfg.Placed:
		m.recovered = true
		m.leave()
	case m.cfg.Recover:
		m.failed = append(m.failed, errors.New("the coordinator died during it"))
		m.undo()
	default:
		m.phase = migStall
		nodes, stay := m.stay()
		for _, n := range nodes {
			m.emit(StallRanks{Node: n, Ranks: stay[n]})
		}
		m.emit(PrepareRank{Rank: m.cfg.Rank, Node: m.cfg.From})
	}
}

// stay groups the ranks that do not move by node.
func (m *Migration) stay() ([]string, map[string][]int) {
	return byNode(m.cfg.Placement, func(r int) bool { return r == m.cfg.Rank })
}

func (m *Migration) result(res Result) {
	if res.Err != nil {
		why := fmt.Errorf("%s: %w", res.Action, res.Err)
		switch a := res.Action.(type) {
		case MoveOut, ResumeRanks, AbortPrepare:
			// Any may have happened with its reply lost: a second call
			// tells (removing a rank that is gone, resuming one that
			// runs, aborting a prepare already dropped, succeed). An
			// abort not carried out leaves the rank frozen for the
			// migration's whole hold.
			if m.again(a) {
				break
			}
			if _, out := a.(MoveOut); out {
				m.failed = append(m.failed, why)
			} else if m.phase < migUnplace {
				m.noted = append(m.noted, why.Error())
			}
		case StallRanks, PrepareRank, MoveIn:
			m.failed = append(m.failed, why)
		case Persist:
			switch a.Phase {
			case PhasePlaced:
				m.failed = append(m.failed, why)
			case PhaseUnplaced:
				// The record still places the rank on its target: undoing
				// now would lose it. Whoever finishes the migration
				// (the next coordinator) moves it again.
				m.fail(append(m.failed, why))
				return
			default:
				m.noted = append(m.noted, why.Error())
			}
		case SetJobNet:
			if !m.again(a) && m.phase < migUnplace {
				m.noted = append(m.noted, why.Error())
			}
		}
	} else if _, out := res.Action.(MoveOut); out {
		m.moveOutDone()
	}
	if !m.idle() {
		return
	}
	if len(m.failed) > 0 && m.phase < migUnplace {
		if m.phase >= migOut {
			// Placed, but the source's copy is still there: the rank
			// goes back to it.
			m.phase = migUnplace
			m.emit(Persist{Phase: PhaseUnplaced})
			return
		}
		m.undo()
		return
	}
	switch m.phase {
	case migStall:
		m.phase = migMove
		m.emit(MoveIn{Rank: m.cfg.Rank, Node: m.cfg.To, From: m.cfg.From})
	case migMove:
		m.phase = migPlace
		m.emit(Persist{Phase: PhasePlaced})
	case migPlace:
		m.phase = migHold1
		m.emit(Failpoint{Name: "migration-before-remove"})
	case migHold1:
		m.leave()
	case migOut:
		m.phase = migHold2
		m.emit(Failpoint{Name: "migration-before-resume"})
	case migHold2:
		m.phase = migResume
		nodes, ranks := byNode(m.moved, nil)
		for _, n := range nodes {
			m.emit(ResumeRanks{Node: n, Ranks: ranks[n]})
		}
	case migResume:
		m.phase = migDrop
		if !slices.Contains(m.moved, m.cfg.From) && !m.cfg.FromLost {
			m.emit(DropJobNet{Node: m.cfg.From})
			return
		}
		m.done()
	case migDrop:
		m.done()
	case migDone:
		m.finish(true, reasons(m.noted))
	case migUnplace:
		m.undo()
	case migUndo1:
		m.phase = migUndo2
		if !slices.Contains(m.cfg.Placement, m.cfg.To) {
			m.emit(DropJobNet{Node: m.cfg.To})
		}
		m.emit(AbortPrepare{Rank: m.cfg.Rank, Node: m.cfg.From})
		nodes, stay := m.stay()
		for _, n := range nodes {
			m.emit(ResumeRanks{Node: n, Ranks: stay[n]})
		}
	case migUndo2:
		m.phase = migFailed
		m.emit(Persist{Phase: PhaseFailed, Reason: m.failed.Error()})
	case migFailed:
		m.fail(m.failed)
	}
}

// leave removes the source's copy (unless its node is dead) and points
// every node's job network at the rank's new node: the source's once the
// copy is gone there (moveOutDone), since its agent refuses to take as
// remote a rank still attached to it.
func (m *Migration) leave() {
	m.phase = migOut
	if !m.cfg.FromLost {
		m.emit(MoveOut{Rank: m.cfg.Rank, Node: m.cfg.From})
	}
	for _, n := range nodesOf(m.moved) {
		if n != m.cfg.From || m.cfg.FromLost {
			m.emit(SetJobNet{Node: n, Placement: m.moved})
		}
	}
}

// moveOutDone points the source's job network at the rank's new node,
// if ranks of the job stay there, once the rank's copy is gone from it.
func (m *Migration) moveOutDone() {
	if m.phase == migOut && slices.Contains(m.moved, m.cfg.From) {
		m.emit(SetJobNet{Node: m.cfg.From, Placement: m.moved})
	}
}

func (m *Migration) done() {
	m.phase = migDone
	why := m.noted
	if m.recovered {
		why = append([]string{"finished by a restarted coordinator"}, why...)
	}
	m.emit(Persist{Phase: PhaseDone, Reason: reasons(why)})
}

// undo removes the target's copy and points the job networks back.
func (m *Migration) undo() {
	m.phase = migUndo1
	m.emit(RemoveRank{Rank: m.cfg.Rank, Node: m.cfg.To})
	for _, n := range nodesOf(m.cfg.Placement) {
		m.emit(SetJobNet{Node: n, Placement: m.cfg.Placement})
	}
}
