// Package control tests end to end a cluster of several coordinators: a
// standby takes over from a leader killed in the middle of each protocol
// and finishes or undoes what it left, and a deposed leader that still
// runs can change nothing.
package control
