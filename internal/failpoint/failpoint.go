// Package failpoint holds a request or a protocol step at a named point,
// for end-to-end tests of a process dying there: with CAIRN_FAILPOINT=NAME
// (or several names, separated by commas) in its environment, a process
// that reaches Hold(ctx, NAME) stays there until ctx ends (its request is
// cancelled, or the test kills it). With CAIRN_FAILPOINT_ARMED=FILE as
// well, the point holds only while FILE exists and is empty or names it
// (a name a line), so that a test can arm the point it wants at the
// moment it wants, and let what it holds go on by removing FILE.
//
// The points: job-before-running (a job start, in the coordinator, once
// every rank runs and before the job is recorded running);
// before-decision and after-decision (a checkpoint round, in
// the coordinator); before-replication (the copies of a durable
// checkpoint, in the coordinator, before any is made); migration-before-remove and migration-before-resume (a
// migration, in the coordinator, once the rank's new node is recorded,
// before and after the source's copy is removed); restart-before-resume
// (a restart, in the coordinator, once every rank is restored and before
// any resumes); prepared (a checkpoint round, in an agent, once its rank
// is prepared: frozen, network locked, dumped; before it answers);
// commit (an agent told to commit a prepared rank, before its image is
// stored); restored (an agent restoring a rank for a restart, once it is
// restored frozen, before it answers);
// resume (an agent told to resume restored ranks, before it does);
// migrate-in (an agent receiving a migrating rank); chunk-data (an agent
// serving a share of an image's chunks, every share but its first);
// fetch-chunks (an agent fetching an image, for a copy or a restart, once
// every chunk is stored and before the image is listed); fetched (the
// same, once the image is listed, before it answers); lazy-pages (a
// lazy restore's page server, once the processes are restored, before it
// fetches pages they lack: their memory still arriving); donor-pages (a
// post-copy migration's source, serving a page request once the rank
// has gone from it); rank-request and rank-reply
// (the rank API, a checkpoint or event request read and not yet carried
// out, or carried out and its reply not yet written); before-freeze (a
// container's checkpoint, once cairn has looked for stopped processes and
// before it freezes the container).
package failpoint

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"
)

// Env and ArmedEnv name the environment variables.
const (
	Env      = "CAIRN_FAILPOINT"
	ArmedEnv = "CAIRN_FAILPOINT_ARMED"
)

// Hold waits, if the failpoint name is set (and armed), until ctx ends or
// the failpoint is disarmed, and says so in log first.
func Hold(ctx context.Context, name string, log *slog.Logger) {
	if !Set(name) {
		return
	}
	if log == nil {
		log = slog.Default()
	}
	log.Warn("failpoint reached: held here", "failpoint", name)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for Set(name) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	log.Warn("failpoint disarmed: going on", "failpoint", name)
}

// Set tells whether the failpoint name is set and armed.
func Set(name string) bool {
	if !slices.Contains(strings.Split(os.Getenv(Env), ","), name) {
		return false
	}
	armed := os.Getenv(ArmedEnv)
	if armed == "" {
		return true
	}
	b, err := os.ReadFile(armed)
	if err != nil {
		return false
	}
	names := strings.Fields(string(b))
	return len(names) == 0 || slices.Contains(names, name)
}
