package round

import (
	"fmt"
	"strconv"
)

// Action is an output of Round.Step, for the driver to perform in order: one
// of SendPrepare, PersistDecision, SendCommit, SendAbort, PersistState and
// Done.
type Action interface {
	fmt.Stringer
	isAction()
}

// SendPrepare asks the participant's agent to lock, freeze, dump and stage
// its rank, and to answer with Prepared or Failed.
type SendPrepare Participant

// PersistDecision asks the driver to write the decision (StateCommitted or
// StateAborted) to the catalog in one transaction, and to step
// DecisionPersisted once it is there. Nothing is sent to a participant
// before that.
type PersistDecision struct {
	State  State
	Reason string // why the round aborts; empty on commit
}

// SendCommit tells the participant's agent that the checkpoint is committed:
// unlock and thaw the rank, ingest its image and answer Durable.
type SendCommit Participant

// SendAbort tells the participant's agent that the checkpoint is aborted:
// unlock and thaw the rank and drop its staged image.
type SendAbort Participant

// PersistState asks the driver to write the round's final state to the
// catalog: StateDurable, or StateAborted for a committed round that lost a
// participant before it was durable.
type PersistState struct {
	State  State
	Reason string
}

// Done is always the last action of a round: it ended in State (StateDurable
// or StateAborted).
type Done struct {
	State  State
	Reason string
	Stats  Stats
}

func (SendPrepare) isAction()     {}
func (PersistDecision) isAction() {}
func (SendCommit) isAction()      {}
func (SendAbort) isAction()       {}
func (PersistState) isAction()    {}
func (Done) isAction()            {}

func (a SendPrepare) String() string { return "send-prepare " + Participant(a).String() }
func (a SendCommit) String() string  { return "send-commit " + Participant(a).String() }
func (a SendAbort) String() string   { return "send-abort " + Participant(a).String() }
func (a PersistDecision) String() string {
	return withReason("persist-decision "+a.State.String(), a.Reason)
}
func (a PersistState) String() string {
	return withReason("persist-state "+a.State.String(), a.Reason)
}
func (a Done) String() string { return withReason("done "+a.State.String(), a.Reason) }

func withReason(s, reason string) string {
	if reason == "" {
		return s
	}
	return s + " " + strconv.Quote(reason)
}
