// How a job ends: its agents report rank containers that have ended with
// their heartbeats, and the coordinator then settles the job's state:
// exited when every rank exited 0, failed when one ended otherwise (at
// once with --kill-on-bad-exit, whose other ranks it kills).

package coord

import (
	"context"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
)

// lifecycle settles how jobs end.
type lifecycle struct{ c *Coordinator }

// settle sets a running job's state by how its ranks stand: exited once
// every rank exited 0; failed once every rank has ended and one did not
// exit 0, or, with KillOnBadExit, as soon as one did not (the others are
// killed). A rank on a dead node, or missing, is for the failure
// handling, and settles nothing; so is a rank its node ended (its lazy
// restore failed): settle returns why, for the job's failure policy, and
// leaves the job as it is. It waits for whatever holds the job.
func (lc *lifecycle) settle(ctx context.Context, name string) (endedBy string) {
	c := lc.c
	defer c.locks.lock(name)()
	j, err := c.rec.job(ctx, name)
	if err != nil || j.State != coordv1.JobRunning {
		return ""
	}
	st, err := c.Status(ctx, name)
	if err != nil {
		return ""
	}
	for _, rs := range st.RankStates {
		if rs.Status == agentv1.StatusExited && rs.EndedBy != "" {
			return fmt.Sprintf("rank %d on %s was ended by its node: %s", rs.Rank, rs.Node, rs.EndedBy)
		}
	}
	var bad []string
	running := 0
	for _, rs := range st.RankStates {
		switch rs.Status {
		case agentv1.StatusExited:
			if rs.ExitCode == nil || *rs.ExitCode != 0 {
				bad = append(bad, rankEnd(rs))
			}
		case agentv1.StatusCheckpointed, agentv1.StatusStopped:
			return "" // stopped by cairn, not ended: not the job's end
		default:
			if !rs.Alive || rs.Status == coordv1.RankMissing || rs.Status == coordv1.RankUnknown {
				return ""
			}
			running++
		}
	}
	switch {
	case running == 0 && len(bad) == 0:
		lc.endJob(ctx, name, coordv1.JobExited, "every rank exited 0")
	case len(bad) > 0 && running == 0:
		lc.endJob(ctx, name, coordv1.JobFailed, strings.Join(bad, "; "))
	case len(bad) > 0 && j.KillOnBadExit:
		reason := strings.Join(bad, "; ") + fmt.Sprintf("; the other %d ranks killed (--kill-on-bad-exit)", running)
		if err := c.runs.signalRanks(ctx, j, syscall.SIGKILL); err != nil {
			c.log.Warn("kill on bad exit", "job", name, "err", err)
			reason += ": " + err.Error()
		}
		lc.endJob(ctx, name, coordv1.JobFailed, reason)
	}
	return ""
}

// rankEnd says how a rank ended.
func rankEnd(rs coordv1.Rank) string {
	switch {
	case rs.ExitCode == nil:
		return fmt.Sprintf("rank %d ended without an exit status", rs.Rank)
	case *rs.ExitCode > 128:
		sig := syscall.Signal(*rs.ExitCode - 128)
		return fmt.Sprintf("rank %d was killed by %s (exit %d)", rs.Rank, unix.SignalName(sig), *rs.ExitCode)
	}
	return fmt.Sprintf("rank %d exited %d", rs.Rank, *rs.ExitCode)
}

// endJob records that job ended in state (exited or failed) for reason,
// and publishes it. The caller holds the job's lock.
func (lc *lifecycle) endJob(ctx context.Context, name string, state coordv1.JobState, reason string) {
	c := lc.c
	_, err := c.rec.updateJob(ctx, name, func(j *coordv1.Job) error {
		j.State, j.Reason = state, reason
		return nil
	})
	if err != nil {
		c.log.Warn("the job ended, but its state could not be recorded", "job", name, "state", state, "err", err)
		return
	}
	typ := evv1.JobExited
	if state == coordv1.JobFailed {
		typ = evv1.JobFailed
	}
	c.log.Info("job ended", "job", name, "state", state, "reason", reason)
	c.publish(evv1.Event{Type: typ, Job: name, Message: reason})
}

// restartGaveUp records that the automatic restart of job gave up after
// its attempts, for reason: the job is failed for that reason, and
// job.restart_failed says so (and counts it), so that an operator, a
// hook and the job-down alert learn of it. A coordinator that is
// stopping gives up nothing.
func (lc *lifecycle) restartGaveUp(ctx context.Context, name, reason string) {
	c := lc.c
	if ctx.Err() != nil {
		return
	}
	defer c.locks.lock(name)()
	_, uerr := c.rec.updateJob(ctx, name, func(j *coordv1.Job) error {
		switch j.State {
		case coordv1.JobRunning, coordv1.JobRestarting, coordv1.JobFailed:
			j.State, j.Reason = coordv1.JobFailed, reason
			j.RestartFrom, j.RestartPhase = 0, ""
			return nil
		}
		return errSettled
	})
	if uerr != nil {
		return // ended otherwise meanwhile (killed, removed)
	}
	c.log.Warn("automatic restart gave up", "job", name, "reason", reason)
	c.publish(evv1.Event{Type: evv1.JobRestartFailed, Job: name, Message: reason})
}
