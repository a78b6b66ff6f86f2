// Package failpoint holds a request or a protocol step at a named point,
// for end-to-end tests of a process dying there: with CAIRN_FAILPOINT=NAME
// in its environment, a process that reaches Hold(ctx, NAME) stays there
// until ctx ends (its request is cancelled, or the test kills it). With
// CAIRN_FAILPOINT_ARMED=FILE as well, the point holds only while FILE
// exists, so that a test can arm it at the moment it wants.
//
// The points: job-before-running (a job start, in the coordinator, once
// every rank runs and before the job is recorded running);
// before-decision and after-decision (a checkpoint round, in
// the coordinator); migration-before-remove and migration-before-resume (a
// migration, in the coordinator, once the rank's new node is recorded,
// before and after the source's copy is removed); restart-before-resume
// (a restart, in the coordinator, once every rank is restored and before
// any resumes); prepared (a checkpoint round, in an agent, once its rank
// is prepared: frozen, network locked, dumped; before it answers);
// migrate-in (an agent receiving a migrating rank); chunk-data (an agent
// serving a share of an image's chunks, every share but its first).
package failpoint

import (
	"context"
	"log/slog"
	"os"
)

// Env and ArmedEnv name the environment variables.
const (
	Env      = "CAIRN_FAILPOINT"
	ArmedEnv = "CAIRN_FAILPOINT_ARMED"
)

// Hold waits for ctx to end if the failpoint name is set (and armed), and
// says so in log first.
func Hold(ctx context.Context, name string, log *slog.Logger) {
	if !Set(name) {
		return
	}
	if log == nil {
		log = slog.Default()
	}
	log.Warn("failpoint reached: held here", "failpoint", name)
	<-ctx.Done()
}

// Set tells whether the failpoint name is set and armed.
func Set(name string) bool {
	if os.Getenv(Env) != name {
		return false
	}
	if armed := os.Getenv(ArmedEnv); armed != "" {
		if _, err := os.Stat(armed); err != nil {
			return false
		}
	}
	return true
}
