// Package agent is a node's daemon: it serves the node's containers,
// checkpoints and restores (package container) to the coordinator and to
// CLI clients over the agent API (api/agent/v1), on mutually
// authenticated TLS with the cluster's credentials (package pki). A caller
// without credentials of the same cluster cannot connect; a connected
// caller must have the coordinator or client role.
//
// Server is the http.Handler and the listener; the typed client the
// coordinator, the CLI and other agents use is rpc.AgentClient. Agent is
// the daemon around it, what `cairn agent` runs (New, then Run): the
// node's credentials, its Manager and the tools of MPI ranks, and, when it
// is in a cluster, its membership: it joins the coordinator, sends
// heartbeats with its failing health probes and its store's quarantine,
// and joins again whenever the coordinator no longer knows it.
package agent
