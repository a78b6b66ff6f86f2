// Package round is the coordinator's global checkpoint round, the two-phase
// commit of docs/protocols.md, as a deterministic state machine: it does no
// I/O, starts no goroutine and reads no clock. Package coord drives it: it
// performs the actions (RPCs to agents, etcd transactions) and steps the
// replies back in, as etcd-io/raft's RawNode is driven by its user.
//
// # Nouns
//
// Job: N ranks started together. Rank: one process tree of the job, in its
// own container, numbered 0..N-1. Node: a host running an agent, which holds
// some of the job's ranks.
//
// Participant: one rank of the job in a round, with the node whose agent
// answers for it.
//
// Ckpt: a global checkpoint, a consistent cut of every rank of a job, named
// by the job and a number (Config.Ckpt; not an "id", which in cairn always
// means a content hash). Image: one rank's part of a ckpt.
//
// Round: the making of one ckpt, with a deadline for the prepare phase:
//
//   - prepare: every participant is sent Prepare; its agent locks, freezes and
//     dumps its rank, stages the image, and answers Prepared or Failed.
//   - decide: if every participant is prepared before the deadline, the
//     decision is commit, otherwise (a failure, a lost participant, the
//     deadline) abort. The decision is persisted in the catalog, in one etcd
//     transaction, before any participant hears of it: the persisted commit is
//     the commit point.
//   - continue: every participant is sent Commit or Abort, and thaws its rank
//     either way (the job always goes on). After a commit each one ingests
//     its image into its node's chunk store and answers Durable; when all
//     have, the round persists durable.
//
// Driver: the code that owns a Round (package coord). It records the round
// as preparing in the catalog, calls New and steps Start; then it performs
// every action in the order given and steps what comes back. It steps
// DecisionPersisted only once the PersistDecision transaction succeeded (and
// retries it until then; the transaction should require the state to still
// be preparing); it acknowledges a PersistDecision returned by an earlier
// Step, never one returned by the same Step. It steps Tick now and then so
// that the deadline is noticed when no reply comes, and Lost when a node's
// lease expires or a connection to an agent breaks. After a restart it calls
// Recover with the persisted state and steps Start.
//
// # States
//
// The round's State is what the catalog records; each participant has a
// RankState. The round goes through these phases:
//
//	          Start                all Prepared
//	new ──────────────► preparing ─────────────► deciding(commit)
//	                        │                     │ DecisionPersisted
//	  Failed, Lost, deadline│                     ▼
//	                        ▼                   committed ── all Durable ──► durable
//	                    deciding(abort)           │          (PersistState)
//	                        │ DecisionPersisted   │ Failed, Lost
//	                        ▼                     ▼ (PersistState)
//	                     aborted ◄────────────────┘
//
// "deciding" is still preparing in the catalog: the decision exists only in
// the PersistDecision action until DecisionPersisted. A Failed or Lost that
// arrives then does not change a commit decision, which may already be in
// the catalog: Commit is still sent to all, and the round then ends aborted
// because the ckpt can never be durable. Commit and Abort are never both
// sent in one round. Every round ends with one Done action, in durable or
// aborted.
//
// Recover rebuilds a round from its persisted state: preparing (no decision
// was persisted) aborts it, committed sends Commit again and waits for
// Durable, aborted sends Abort again, durable ends it.
//
// # Duplicates and late messages
//
// Step ignores what does not fit the round (a second reply, a reply from a
// rank not in the round, Durable after an abort, an acknowledgment with no
// decision pending, any event after Done) and says so with an error wrapping
// ErrUnexpected or ErrUnknownRank; the round is unchanged and Stats.Ignored
// counts it. A Prepared that comes after the decision still answers our
// Prepare: it is recorded in the rank's state and stats, and changes nothing
// else.
//
// # API choices
//
// Step takes the driver's clock reading with every event, not only with
// Tick: the deadline is checked on every input, so a Prepared that arrives
// after the deadline cannot commit the round, and Stats are computed from
// the times of the events themselves.
//
// Step returns the actions it caused instead of raft's Ready/Advance pair.
// raft needs Advance because a Ready mixes state to persist with messages
// that may only leave afterwards. Here the only such ordering, the decision
// before any Commit or Abort, is part of the protocol and is modelled in it
// (the PersistDecision action and the DecisionPersisted event), so a second
// handshake would duplicate it. Returned actions also keep cause and effect
// together in traces, and leave no outbox for the driver to forget.
//
// Stats gives the round's timing breakdown; Coord is t_coord of the overhead
// model: the time ranks stay frozen minus the slowest dump.
package round
