// Package agenttest is the conformance suite of the node agent as the
// coordinator sees it (coord.Agent): one table of the agent's contract,
// run against every implementation, so that the coordinator's fast tests
// and benchmarks on in-memory agents (coord/memagent) stay true to the
// real agent (internal/agent). Where the two differ, the real agent is
// the reference.
//
// Run drives two fresh nodes of an Env through each case over the agent
// API alone, and asserts what a coordinator can observe: the code of each
// refusal (*agentv1.Error), the state of each rank container (running,
// frozen, exited, gone; its network locked or not), and what a call sent
// twice answers. The cases cover starting a rank, a checkpoint round's
// prepare, commit and abort, stalls and resumes, restores from a
// committed checkpoint, migrations out and in, image fetches and drops,
// job networks, queries and kills, and the holds the agent ends by itself
// (a stall, a prepare, a migrated-in rank; a prepared image nobody
// decided).
//
// The vocabulary is the agent API's: a node holds rank containers named
// JOB.RANK; a hold is how long a rank waits for the coordinator's next
// call before the agent ends the wait by itself.
package agenttest
