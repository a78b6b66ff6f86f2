// Package conform runs the agent's conformance suite (internal/coord/
// agenttest) against real agents, the reference the in-memory agents of
// the coordinator's tests (internal/coord/memagent) are held to. Unlike
// the other end-to-end packages it drives no cluster through the cairn
// binary: it serves agent.Server in this process, one container.Manager
// and one network namespace per node, so that every case gets fresh
// nodes in a fraction of a second and the agents' holds can be short.
// The ranks are shell loops in runc containers, checkpointed by CRIU.
package conform
