package round

// State is the state of a round's global checkpoint as the catalog records
// it.
type State uint8

// The catalog states of a round. A round starts in StatePreparing; its
// decision is StateCommitted or StateAborted; it ends in StateDurable or
// StateAborted.
const (
	StatePreparing State = iota + 1
	StateCommitted
	StateDurable
	StateAborted
)

var stateNames = [...]string{"", "preparing", "committed", "durable", "aborted"}

func (s State) String() string {
	if int(s) < len(stateNames) && s != 0 {
		return stateNames[s]
	}
	return "invalid"
}

// RankState is what the round knows of one participant.
type RankState uint8

// The states of a participant. RankPending means no Prepare was sent yet;
// RankFailed and RankLost are final.
const (
	RankPending RankState = iota
	RankPreparing
	RankPrepared
	RankDurable
	RankFailed
	RankLost

	rankStates = iota // how many there are
)

var rankStateNames = [...]string{"pending", "preparing", "prepared", "durable", "failed", "lost"}

func (s RankState) String() string {
	if int(s) < len(rankStateNames) {
		return rankStateNames[s]
	}
	return "invalid"
}
