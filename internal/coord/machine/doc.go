// Package machine holds the coordinator's protocols other than the
// checkpoint round (package coord/round) as deterministic state machines:
// the start of a job (Start), the restart of a whole job from a checkpoint
// (Restart) and the live migration of one rank (Migration). Like the round
// they do no I/O, start no goroutine and read no clock; package coord
// drives them: it performs their actions (calls to agents, catalog writes)
// and steps back what comes of each.
//
// # Nouns
//
// Job, rank, node and ckpt mean what they mean in package round. Placement
// is the node of each rank, by rank. A phase is a named point of a protocol
// that the catalog records, so that a coordinator that dies there is
// followed by one that knows where the protocol stood (docs/protocols.md).
//
// # Driving a machine
//
// The driver calls the constructor with what the catalog holds (New for a
// protocol it begins, Recover for one an earlier coordinator left in a
// recorded phase), steps Start, and then:
//
//   - performs every action of a Step in the order given. An action that
//     calls an agent may run concurrently with the others of its Step; the
//     driver steps exactly one Result for each, with the error the agent
//     gave (nil on success). An action whose Background method says so is
//     the exception: the driver performs it on its own and steps nothing
//     back.
//   - performs Persist by writing the phase's record to the catalog, and
//     Failpoint by holding there if the failpoint is set; each has its
//     Result too. A machine never emits anything with, or after, a Persist
//     or Failpoint in one Step: what follows waits for its Result.
//   - stops at Done, the last action of every run. No action but a
//     background one is outstanding then.
//
// A Result names the action it answers; Step ignores, with an error
// wrapping ErrUnexpected, a Result for an action that is not outstanding,
// and any event after Done.
//
// # Failures
//
// An agent that does not answer (its node is dead, or the network
// dropped the call) and one that refuses are both a failed Result: the
// machines decide from where they stand, not from why. What a failure
// leads to is in each machine's comment and, with what the catalog holds
// at each phase, in docs/protocols.md.
package machine
