// Package metrics is what cairn exports to Prometheus: the coordinator's
// series of jobs, ranks, rounds, replicas, restarts, migrations and nodes
// ([Coord]), and every agent's series of its node's store, staging and
// health probes ([Node]), each in a registry of its own, served at [Path]
// in the text format ([Handler]) behind the API's client certificates or a
// read-only bearer token ([Token]).
//
// # Nouns
//
// Def: one metric family as defined here, with its type, help and labels;
// every family of a registry is a Def, and docs/cluster.md lists them.
//
// Event: an event of the coordinator's stream (api/events/v1). The
// coordinator's counters, histograms and timestamps are derived from its
// events; a replayed event (the history a restarted coordinator reads
// back) sets gauges only, so counters count what this coordinator saw.
//
// Record: a checkpoint's or migration's record in the catalog
// (api/coord/v1), read once per durable checkpoint for its per-rank
// figures and once per migration for its phases.
//
// Snapshot: the catalog's jobs and nodes, read at most once a second, at a
// scrape, for the gauges of their state.
//
// Labels are low-cardinality: job_name, rank, node, state, reason, phase,
// result, probe, type. The job's label is job_name, never job: Prometheus
// gives every scraped series a target label job of its own. Checkpoint
// numbers are values (..._number), never labels.
//
// This package imports nothing of cairn but the wire APIs: the coordinator
// and the agent both link it, and it links neither's stack.
package metrics
