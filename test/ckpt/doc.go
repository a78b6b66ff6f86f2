// Package ckpt tests global checkpoints end to end: rounds taken on
// demand and periodically while the ring job runs, whole-job restarts
// from them on other nodes, rounds aborted by a participant that dies or
// fails, and a coordinator killed in the middle of a round, a restart or
// a job's start, whose successor finishes or undoes what it left.
package ckpt
