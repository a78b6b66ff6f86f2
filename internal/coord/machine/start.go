package machine

import (
	"fmt"
	"time"
)

// Phases of a job start. The job's record is created in PhaseStarting
// with its placement before the machine runs.
const (
	// PhaseRunning: every rank runs; the job is recorded running.
	PhaseRunning Phase = "running"
	// PhaseRemoved: the start failed and what it started is gone; the
	// job's record is deleted, so that the same start can simply be
	// asked for again.
	PhaseRemoved Phase = "removed"
)

// StartConfig describes a job start.
type StartConfig struct {
	Job       string
	Placement []string // the node of each rank
	// Recover: the job was found starting, its start cut short by the
	// death of an earlier coordinator.
	Recover bool
}

type startPhase uint8

const (
	startNew      startPhase = iota
	startQuery               // recovering: which ranks run?
	startClear               // recovering: removing what runs, to start again
	startClearNet            // recovering: and the job networks
	startRun                 // RunRank sent
	startHold                // every rank runs: the failpoint
	startPersist             // persisting running
	startUndo                // the start failed: removing what started
	startUndoNet             // and the job networks
	startRemove              // persisting removed
)

// JobStart is the state machine of a job start: every rank is started on
// its node; once all run the job is recorded running. A start that fails
// is undone: what started is removed, then the job networks, then the
// job's record (PhaseRemoved).
//
// Recovered (a job found starting), it asks every rank's node what runs:
// if every rank runs, the job is recorded running; otherwise whatever runs
// is removed and every rank is started again, as asked (the job has no
// checkpoint to lose). A recovered start that fails is undone the same
// way, but ends without a Persist: its record stays starting, for the
// driver to try again once more nodes have joined or to record failed.
type JobStart struct {
	core
	cfg    StartConfig
	phase  startPhase
	failed failures
}

// NewStart returns the machine of the start cfg describes.
func NewStart(cfg StartConfig) (*JobStart, error) {
	if len(cfg.Placement) == 0 {
		return nil, fmt.Errorf("start job %s: no ranks", cfg.Job)
	}
	for r, n := range cfg.Placement {
		if n == "" {
			return nil, fmt.Errorf("start job %s: rank %d has no node", cfg.Job, r)
		}
	}
	return &JobStart{cfg: cfg}, nil
}

// Step advances the start by one event; now is unused (a start has no
// timers) but kept for the drivers' common shape.
func (m *JobStart) Step(_ time.Time, ev Event) ([]Action, error) {
	out, err := m.step(ev, m.phase != startNew, m.start, m.result)
	if err != nil {
		return nil, fmt.Errorf("start job %s: %w", m.cfg.Job, err)
	}
	return out, nil
}

func (m *JobStart) start() {
	if m.cfg.Recover {
		m.phase = startQuery
		for r, n := range m.cfg.Placement {
			m.emit(QueryRank{Rank: r, Node: n})
		}
		return
	}
	m.run()
}

func (m *JobStart) run() {
	m.phase = startRun
	for r, n := range m.cfg.Placement {
		m.emit(RunRank{Rank: r, Node: n})
	}
}

func (m *JobStart) result(res Result) {
	switch a := res.Action.(type) {
	case QueryRank:
		if res.Err != nil {
			m.failed = append(m.failed, fmt.Errorf("rank %d: %w", a.Rank, res.Err))
		} else if res.Status != "running" {
			m.failed = append(m.failed, fmt.Errorf("rank %d is %s", a.Rank, orNone(res.Status)))
		}
	case RunRank:
		if res.Err != nil {
			m.failed = append(m.failed, fmt.Errorf("rank %d on %s: %w", a.Rank, a.Node, res.Err))
		}
	case Persist:
		if res.Err != nil {
			m.fail(append(m.failed, fmt.Errorf("record the job %s: %w", a.Phase, res.Err)))
			return
		}
	}
	if !m.idle() {
		return
	}
	switch m.phase {
	case startQuery:
		if len(m.failed) == 0 {
			m.phase = startPersist
			m.emit(Persist{Phase: PhaseRunning})
			return
		}
		m.failed = nil // why not every rank runs: no reason to fail
		m.phase = startClear
		m.removeAll()
	case startClear:
		m.phase = startClearNet
		m.dropNets()
	case startClearNet:
		m.run()
	case startRun:
		if len(m.failed) > 0 {
			m.phase = startUndo
			m.removeAll()
			return
		}
		m.phase = startHold
		m.emit(Failpoint{Name: "job-before-running"})
	case startHold:
		m.phase = startPersist
		m.emit(Persist{Phase: PhaseRunning})
	case startPersist:
		m.finish(true, "")
	case startUndo:
		m.phase = startUndoNet
		m.dropNets()
	case startUndoNet:
		if m.cfg.Recover {
			m.fail(m.failed)
			return
		}
		m.phase = startRemove
		m.emit(Persist{Phase: PhaseRemoved, Reason: m.failed.Error()})
	case startRemove:
		m.fail(m.failed)
	}
}

// removeAll removes every rank (best effort: failures are not waited on
// beyond their Result).
func (m *JobStart) removeAll() {
	for r, n := range m.cfg.Placement {
		m.emit(RemoveRank{Rank: r, Node: n})
	}
}

func (m *JobStart) dropNets() {
	for _, n := range nodesOf(m.cfg.Placement) {
		m.emit(DropJobNet{Node: n})
	}
}
