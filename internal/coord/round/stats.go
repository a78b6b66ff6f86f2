package round

import "time"

// Stats is the round's timing breakdown, computed from the times of the
// events it was stepped with. A duration whose phase did not happen is zero;
// a recovered round knows only what happened after Recover.
type Stats struct {
	Prepare time.Duration // Start to the decision
	Persist time.Duration // the decision to DecisionPersisted
	Stall   time.Duration // Start to Commit or Abort sent: how long ranks stay frozen
	MaxDump time.Duration // the slowest reported dump
	// Coord is t_coord of the overhead model: the part of Stall not spent
	// dumping (messages, waiting for the slowest rank, the catalog write).
	Coord     time.Duration
	Ingest    time.Duration // Commit sent to the last Durable
	Bytes     int64         // total image size of the prepared ranks
	Ignored   int           // events Step ignored
	Recovered bool          // the round was rebuilt by Recover
	Ranks     []RankStats   // in Config.Participants order
}

// RankStats is one participant's part of Stats.
type RankStats struct {
	Participant
	State   RankState
	Reason  string        // why it failed or was lost
	Size    int64         // image size it reported
	Dump    time.Duration // dump time it reported
	Prepare time.Duration // Start to its Prepared
	Durable time.Duration // Commit sent to its Durable
}

// Stats returns the round's statistics so far.
func (r *Round) Stats() Stats {
	s := Stats{
		Prepare:   between(r.started, r.decided),
		Persist:   between(r.decided, r.sent),
		Stall:     between(r.started, r.sent),
		Ignored:   r.ignored,
		Recovered: r.recovered != 0,
		Ranks:     make([]RankStats, len(r.ranks)),
	}
	var lastDurable time.Time
	for i, rk := range r.ranks {
		s.Ranks[i] = RankStats{
			Participant: rk.Participant, State: rk.state, Reason: rk.reason,
			Size: rk.size, Dump: rk.dump,
			Prepare: between(r.started, rk.preparedAt),
			Durable: between(r.sent, rk.durableAt),
		}
		s.Bytes += rk.size
		s.MaxDump = max(s.MaxDump, rk.dump)
		if rk.durableAt.After(lastDurable) {
			lastDurable = rk.durableAt
		}
	}
	if r.final == StateDurable {
		s.Ingest = between(r.sent, lastDurable)
	}
	s.Coord = max(s.Stall-s.MaxDump, 0)
	return s
}

// between is b-a, or zero when either is unknown.
func between(a, b time.Time) time.Duration {
	if a.IsZero() || b.IsZero() {
		return 0
	}
	return b.Sub(a)
}
