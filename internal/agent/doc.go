// Package agent is a node's daemon (cairn agent): it serves the node's
// containers and its part of the cluster's jobs over the agent API
// (api/agent/v1), JSON over mutually authenticated TLS with the cluster's
// credentials (package pki). A caller without credentials of the same
// cluster cannot connect; a connected caller must be the coordinator or a
// client, except that other agents may read images, to fetch a rank's
// image to their node.
//
// Server is the http.Handler and the listener: a table of routes over an
// http.ServeMux (server.go), with errors mapped to the API's codes in one
// place (failErr). Behind it:
//
//   - containers (containers.go, logs.go): single containers for the CLI:
//     run, checkpoint, restore, kill, logs and incarnations;
//   - ranks (ranks.go): a job's network on this node and its ranks, run,
//     restored frozen into a locked network namespace, resumed, removed;
//   - the participant (participant.go): this node's side of a global
//     checkpoint's two-phase commit (a rank prepared, then held frozen
//     until commit, abort or the end of its hold) and the holds of a
//     migration's ranks; it asks for the operations on ranks through
//     rankOps (rankops.go: the Manager and the rank network namespaces);
//   - migrations (migrate.go): the staged image of a prepared rank
//     streamed from the source's staging to the target, which restores it
//     frozen, and the source's copy removed;
//   - image transfers: fetches from every holder at once (fetch.go,
//     holders.go), the streams served to other agents and the CLI
//     (transfer.go, chunkdata.go), and lazy restores whose pages come from
//     the holders while the rank runs (lazy.go); replication runs at the
//     lowest priority (priority.go) and at a limited rate (ratelimit.go);
//   - health probes (health.go), whose failures ride on the heartbeats.
//
// Words, as in log keys: a job's rank runs as container JOB.RANK (rank);
// ckpt is a global checkpoint, by its number, and an image one rank's
// state in it (container:seq); a holder is a peer that has an image; a
// hold is how long a rank waits for the coordinator before this node acts
// alone (thaws, resumes or removes it).
//
// The typed client the coordinator, the CLI and other agents use is
// rpc.AgentClient. The agent never reaches etcd.
//
// Agent is the daemon around Server, what `cairn agent` runs (New, then
// Run): the node's credentials, its Manager and the tools of MPI ranks,
// and, when it is in a cluster, its membership: it joins the coordinator,
// sends heartbeats with its failing health probes and its store's
// quarantine, and joins again whenever the coordinator no longer knows it.
package agent
