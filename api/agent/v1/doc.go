// Package v1 is version 1 of the wire API of a cairn node agent: JSON over
// HTTPS (HTTP/2, TLS 1.3, mutual authentication with cluster credentials,
// see internal/pki). Every path starts with /v1/. Errors are returned as an
// Error body with an HTTP status; Code is stable for programs to act on.
//
// Why JSON over HTTPS and not gRPC: nothing to generate or install, every
// call can be made by hand with curl and the node's credentials, and the
// standard library serves it. The types here are the contract: fields are
// only ever added, never renamed or removed, within v1.
//
// This package imports nothing from cairn's internal packages.
package v1
