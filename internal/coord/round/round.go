package round

import (
	"errors"
	"fmt"
	"time"
)

// Step reports that it ignored an event, without changing the round, with an
// error wrapping one of these. The driver may log it and go on.
var (
	// ErrUnknownRank: the event names a rank that is not in the round.
	ErrUnknownRank = errors.New("rank not in round")
	// ErrUnexpected: the event does not fit the round's state, such as a
	// second reply, a reply after the round ended, or an acknowledgment of
	// no pending decision.
	ErrUnexpected = errors.New("unexpected event")
)

// Participant is one rank of the job and the node whose agent holds it.
type Participant struct {
	Rank int
	Node string
}

func (p Participant) String() string { return fmt.Sprintf("r%d@%s", p.Rank, p.Node) }

// Config describes a round as the catalog records it before Start.
type Config struct {
	Job          string        // the job's name
	Ckpt         uint64        // the global checkpoint this round makes, numbered per job
	Participants []Participant // one per rank; ranks are distinct
	Deadline     time.Time     // every participant must be prepared before it
}

// phase refines State with what the round is waiting for.
type phase uint8

const (
	phaseNew        phase = iota // before Start
	phasePreparing               // Prepare sent, waiting for replies
	phaseDeciding                // decision made, waiting for DecisionPersisted
	phaseContinuing              // Commit sent, waiting for Durable
	phaseDone                    // Done emitted
)

type rank struct {
	Participant
	state      RankState
	reason     string
	size       int64
	dump       time.Duration
	preparedAt time.Time
	durableAt  time.Time
}

// Round is the state machine of one global checkpoint round. It is not safe
// for concurrent use: the driver steps it from one goroutine.
type Round struct {
	cfg       Config
	recovered State // the persisted state Recover started from, or 0
	ranks     []rank
	byRank    map[int]int // rank number -> index in ranks

	phase    phase
	counts   [rankStates]int // ranks in each RankState
	decision State           // StateCommitted or StateAborted once decided
	reason   string          // why the round aborts
	final    State           // StateDurable or StateAborted once done

	now                    time.Time // latest time seen; never goes back
	started, decided, sent time.Time
	ignored                int
	out                    []Action
	// ackable: a decision was pending when the current Step began, so a
	// DecisionPersisted can acknowledge it. A decision made by this very
	// Step (on the deadline) is not the driver's to acknowledge yet.
	ackable bool
}

// New returns a round that has not started: Step(now, Start{}) sends the
// Prepare messages. The driver must have recorded the round in the catalog
// as preparing before, so that Recover can find it after a crash.
func New(cfg Config) (*Round, error) {
	if cfg.Deadline.IsZero() {
		return nil, fmt.Errorf("new round job %s ckpt %d: no deadline", cfg.Job, cfg.Ckpt)
	}
	return build("new", cfg)
}

// Recover rebuilds the round cfg from the state persisted in the catalog
// after a coordinator restart; Step(now, Start{}) resumes it. A round found
// preparing has no persisted decision and aborts: its participants may be
// frozen, waiting for a decision no one will make. A committed round sends
// Commit again and waits for Durable; an aborted one sends Abort again (the
// old coordinator may have died before sending it); a durable one is done.
func Recover(cfg Config, s State) (*Round, error) {
	if s < StatePreparing || s > StateAborted {
		return nil, fmt.Errorf("recover round job %s ckpt %d: invalid state %d", cfg.Job, cfg.Ckpt, s)
	}
	r, err := build("recover", cfg)
	if err != nil {
		return nil, err
	}
	r.recovered = s
	rs := map[State]RankState{StatePreparing: RankPreparing, StateCommitted: RankPrepared,
		StateDurable: RankDurable, StateAborted: RankPreparing}[s]
	for i := range r.ranks {
		r.set(&r.ranks[i], rs)
	}
	return r, nil
}

func build(op string, cfg Config) (*Round, error) {
	if len(cfg.Participants) == 0 {
		return nil, fmt.Errorf("%s round job %s ckpt %d: no participants", op, cfg.Job, cfg.Ckpt)
	}
	r := &Round{cfg: cfg, byRank: make(map[int]int, len(cfg.Participants))}
	for i, p := range cfg.Participants {
		if _, dup := r.byRank[p.Rank]; dup {
			return nil, fmt.Errorf("%s round job %s ckpt %d: duplicate rank %d", op, cfg.Job, cfg.Ckpt, p.Rank)
		}
		if p.Node == "" {
			return nil, fmt.Errorf("%s round job %s ckpt %d: rank %d has no node", op, cfg.Job, cfg.Ckpt, p.Rank)
		}
		r.byRank[p.Rank] = i
		r.ranks = append(r.ranks, rank{Participant: p})
		r.counts[RankPending]++
	}
	return r, nil
}

// State returns the round's catalog state: preparing until the decision is
// persisted, then committed or aborted, and durable or aborted at the end.
func (r *Round) State() State {
	switch r.phase {
	case phaseNew:
		if r.recovered != 0 {
			return r.recovered
		}
	case phaseContinuing:
		return StateCommitted
	case phaseDone:
		return r.final
	}
	return StatePreparing
}

// Done reports whether the round has ended (its Done action was emitted).
func (r *Round) Done() bool { return r.phase == phaseDone }

// Step advances the round by one event observed at now and returns the
// actions to perform, in order. A non-nil error wraps ErrUnknownRank or
// ErrUnexpected and means ev itself was ignored; the actions are still
// valid, since time alone may have made the round abort. The caller owns the
// returned slice.
func (r *Round) Step(now time.Time, ev Event) ([]Action, error) {
	if now.After(r.now) {
		r.now = now
	}
	r.out = nil
	r.ackable = r.phase == phaseDeciding
	if r.phase == phasePreparing && !r.now.Before(r.cfg.Deadline) {
		r.decide(StateAborted, "deadline exceeded")
	}
	err := r.step(ev)
	if err != nil {
		r.ignored++
		err = fmt.Errorf("round job %s ckpt %d: %w", r.cfg.Job, r.cfg.Ckpt, err)
	}
	out := r.out
	r.out = nil
	return out, err
}

func (r *Round) step(ev Event) error {
	switch ev.(type) {
	case Tick:
		return nil
	case Start:
		if r.phase != phaseNew {
			return fmt.Errorf("%w: start: already started", ErrUnexpected)
		}
		r.start()
		return nil
	case nil:
		return fmt.Errorf("%w: nil event", ErrUnexpected)
	}
	switch r.phase {
	case phaseNew:
		return fmt.Errorf("%w: %T before start", ErrUnexpected, ev)
	case phaseDone:
		return fmt.Errorf("%w: %T after the round ended %s", ErrUnexpected, ev, r.final)
	}
	switch ev := ev.(type) {
	case DecisionPersisted:
		if !r.ackable {
			return fmt.Errorf("%w: decision persisted, but no decision is pending", ErrUnexpected)
		}
		r.persisted()
		return nil
	case Prepared:
		return r.prepared(ev)
	case Failed:
		return r.broken(ev.Rank, RankFailed, ev.Reason)
	case Lost:
		return r.broken(ev.Rank, RankLost, ev.Reason)
	case Durable:
		return r.durable(ev.Rank)
	}
	return fmt.Errorf("%w: unknown event %T", ErrUnexpected, ev)
}

func (r *Round) start() {
	r.started = r.now
	switch r.recovered {
	case 0:
		r.phase = phasePreparing
		if !r.now.Before(r.cfg.Deadline) {
			r.decide(StateAborted, "deadline passed before start")
			return
		}
		for i := range r.ranks {
			r.set(&r.ranks[i], RankPreparing)
			r.emit(SendPrepare(r.ranks[i].Participant))
		}
	case StatePreparing:
		r.phase = phasePreparing
		r.decide(StateAborted, "coordinator restarted before the decision")
	case StateCommitted:
		r.decision = StateCommitted
		r.sendDecision()
	case StateAborted:
		r.decision = StateAborted
		r.sendDecision()
	case StateDurable:
		r.decision = StateCommitted
		r.finish(StateDurable, "", false)
	}
}

func (r *Round) lookup(n int) (*rank, error) {
	i, ok := r.byRank[n]
	if !ok {
		return nil, fmt.Errorf("%w: rank %d", ErrUnknownRank, n)
	}
	return &r.ranks[i], nil
}

func (r *Round) prepared(ev Prepared) error {
	rk, err := r.lookup(ev.Rank)
	if err != nil {
		return err
	}
	if rk.state != RankPreparing {
		return fmt.Errorf("%w: prepared from rank %d, which is %s", ErrUnexpected, ev.Rank, rk.state)
	}
	// A reply to our Prepare is recorded even after the decision: it only
	// counts toward the decision while the round is preparing.
	r.set(rk, RankPrepared)
	rk.size, rk.dump, rk.preparedAt = ev.ImageSize, ev.Dump, r.now
	if r.phase == phasePreparing && r.counts[RankPrepared] == len(r.ranks) {
		r.decide(StateCommitted, "")
	}
	return nil
}

// broken records that a participant failed or was lost. Before the decision
// this aborts the round; after a commit decision the checkpoint can no longer
// become durable, so it ends aborted once Commit was sent.
func (r *Round) broken(n int, s RankState, why string) error {
	rk, err := r.lookup(n)
	if err != nil {
		return err
	}
	ok := rk.state == RankPreparing || rk.state == RankPrepared ||
		s == RankLost && rk.state == RankDurable && r.phase == phaseContinuing
	if !ok {
		return fmt.Errorf("%w: %s from rank %d, which is %s", ErrUnexpected, s, n, rk.state)
	}
	r.set(rk, s)
	rk.reason = fmt.Sprintf("rank %d %s", n, s)
	if why != "" {
		rk.reason += ": " + why
	}
	switch r.phase {
	case phasePreparing:
		r.decide(StateAborted, rk.reason)
	case phaseContinuing:
		r.finish(StateAborted, rk.reason, true)
	}
	return nil
}

func (r *Round) durable(n int) error {
	rk, err := r.lookup(n)
	if err != nil {
		return err
	}
	if r.phase != phaseContinuing || rk.state != RankPrepared {
		return fmt.Errorf("%w: durable from rank %d, which is %s, in a round %s",
			ErrUnexpected, n, rk.state, r.State())
	}
	r.set(rk, RankDurable)
	rk.durableAt = r.now
	if r.counts[RankDurable] == len(r.ranks) {
		r.finish(StateDurable, "", true)
	}
	return nil
}

func (r *Round) decide(s State, why string) {
	r.phase, r.decision, r.reason, r.decided = phaseDeciding, s, why, r.now
	r.emit(PersistDecision{State: s, Reason: why})
}

// persisted handles the acknowledgment of the decision: only now may the
// participants hear of it.
func (r *Round) persisted() {
	r.sendDecision()
	if r.decision != StateCommitted || r.counts[RankFailed]+r.counts[RankLost] == 0 {
		return
	}
	for _, rk := range r.ranks {
		if rk.state == RankFailed || rk.state == RankLost {
			r.finish(StateAborted, rk.reason, true)
			return
		}
	}
}

// sendDecision tells every participant the persisted decision, lost ones
// too: a broken connection does not mean a dead agent, and a live one must
// thaw its rank. The driver drops messages to nodes it knows are dead.
func (r *Round) sendDecision() {
	r.sent = r.now
	for _, rk := range r.ranks {
		if r.decision == StateCommitted {
			r.emit(SendCommit(rk.Participant))
		} else {
			r.emit(SendAbort(rk.Participant))
		}
	}
	if r.decision == StateCommitted {
		r.phase = phaseContinuing
	} else {
		r.finish(StateAborted, r.reason, false)
	}
}

// finish ends the round in s. The final state is persisted unless it is the
// persisted decision already.
func (r *Round) finish(s State, why string, persist bool) {
	r.phase, r.final, r.reason = phaseDone, s, why
	if persist {
		r.emit(PersistState{State: s, Reason: why})
	}
	r.emit(Done{State: s, Reason: why, Stats: r.Stats()})
}

func (r *Round) emit(a Action) { r.out = append(r.out, a) }

// set puts a rank in state s, keeping the counts: every change of a
// rank's state goes through here, so that no event costs a scan of every
// rank (a round of 10,000 ranks steps 20,000 events).
func (r *Round) set(rk *rank, s RankState) {
	r.counts[rk.state]--
	rk.state = s
	r.counts[s]++
}
