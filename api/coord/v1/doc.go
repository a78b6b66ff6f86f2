// Package v1 is version 1 of the coordinator's wire API, spoken by agents
// (join, heartbeat) and by the CLI (jobs, checkpoints, restarts): JSON over
// HTTPS with the same mutual TLS as the agent API (api/agent/v1), and the
// same Error body. Fields are only ever added within v1.
//
// This package imports nothing from cairn's internal packages.
package v1
