// Package version says which cairn a binary is: the module version and
// the revision it was built from (stamped by the Go toolchain, or set by
// the Makefile for builds without VCS stamping), the Go release, and the
// version of the agent and coordinator wire APIs.
package version
