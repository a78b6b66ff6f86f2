package round

import "time"

// Event is an input to Round.Step: one of Start, Tick, Prepared, Failed,
// Lost, DecisionPersisted and Durable.
type Event interface{ isEvent() }

// Start begins the round: a new round sends Prepare to every participant, a
// recovered one resumes from its persisted state.
type Start struct{}

// Tick reports that time passed. It lets the round notice its deadline when
// no reply comes.
type Tick struct{}

// Prepared is a participant's reply to Prepare: its rank is locked, frozen
// and dumped, and its image is staged on its node.
type Prepared struct {
	Rank      int
	ImageSize int64         // bytes of the staged image
	Dump      time.Duration // the agent's time to lock, freeze and dump the rank
}

// Failed is a participant's report that it cannot take part: its prepare
// failed, or, after the commit, its image could not be made durable.
type Failed struct {
	Rank   int
	Reason string
}

// Lost reports that the coordinator lost a participant: its node's lease
// expired or its connection broke.
type Lost struct {
	Rank   int
	Reason string
}

// DecisionPersisted acknowledges the last PersistDecision action: the
// decision is in the catalog.
type DecisionPersisted struct{}

// Durable is a participant's report that its image is ingested into its
// node's chunk store.
type Durable struct {
	Rank int
}

func (Start) isEvent()             {}
func (Tick) isEvent()              {}
func (Prepared) isEvent()          {}
func (Failed) isEvent()            {}
func (Lost) isEvent()              {}
func (DecisionPersisted) isEvent() {}
func (Durable) isEvent()           {}
