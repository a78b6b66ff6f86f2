package coord

import (
	"context"
	"net/http"
	"sync"

	"golang.org/x/time/rate"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/pki"
)

// The rank API's requests, forwarded by the agent of the rank's node
// (docs/rank-api.md): an agent may ask only for ranks it holds, which
// keeps a rank to its own job.

// Rank events a job may publish: 10 a second, in bursts of 20.
const (
	rankEventRate  = 10
	rankEventBurst = 20
)

// rankAPI answers the ranks' own requests (api/rank/v1), relayed by
// their agents.
type rankAPI struct {
	c *Coordinator

	mu sync.Mutex
	// events limits each job's rank events.
	events map[string]*rate.Limiter
	// rounds are the rounds ranks asked for that wait to start, by job
	// (rankCheckpoint).
	rounds map[string]*rankRound
}

// rankJob returns the job of a rank's request, checking that node holds
// the rank.
func (ra *rankAPI) rankJob(ctx context.Context, node string, req coordv1.RankRequest) (*coordv1.Job, error) {
	c := ra.c
	j, err := c.rec.job(ctx, req.Job)
	if err != nil {
		return nil, err
	}
	if req.Rank < 0 || req.Rank >= len(j.Placement) || j.Placement[req.Rank] != node {
		return nil, apiErr(agentv1.CodeForbidden, "node %s holds no rank %d of job %s", node, req.Rank, req.Job)
	}
	return j, nil
}

// RankCheckpoint takes a global checkpoint of a job that one of its
// ranks, on node, asked for; with Stop, the job is stopped at it, as
// cairn checkpoint --stop does (Checkpoint).
func (c *Coordinator) RankCheckpoint(ctx context.Context, node string, req coordv1.RankRequest) (*coordv1.Ckpt, error) {
	if _, err := c.ranks.rankJob(ctx, node, req); err != nil {
		return nil, err
	}
	c.log.Info("a rank asks for a checkpoint of its job", "job", req.Job, "rank", req.Rank, "stop", req.Stop)
	return c.ranks.rankCheckpoint(ctx, req.Job, req.Stop)
}

// rankRound is a round ranks asked for that waits for its job's lock;
// done is closed once it has ended, ck and err saying how.
type rankRound struct {
	done chan struct{}
	ck   *coordv1.Ckpt
	err  error
	// stop, set under rankAPI.mu, says that a rank asked for the job to
	// be stopped at this round: one such ask makes the whole round a
	// stop round.
	stop bool
	// dropped, set under rankAPI.mu, says why the round must not start: the
	// job was killed or removed while it waited.
	dropped string
}

// dropRankRound makes the round ranks of job asked for, if one waits to
// start, end without running, for why: a kill or rm of the job does not
// wait for it.
func (ra *rankAPI) dropRankRound(job, why string) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	if r := ra.rounds[job]; r != nil {
		r.dropped = why
		delete(ra.rounds, job) // a later ask starts a round of its own
	}
}

// rankCheckpoint takes a round of job that a rank asked for, a stop round
// if stop. While one such round waits to start, later asks join it (an
// ask with stop makes it a stop round): however often its ranks ask, a
// job has at most one round waiting behind the one that runs (which began
// before the ask, and does not count for it). A kill or rm drops a round
// that waits (dropRankRound): it waits only for the one that runs. The
// round is not cancelled with the first asker's request.
func (ra *rankAPI) rankCheckpoint(ctx context.Context, job string, stop bool) (*coordv1.Ckpt, error) {
	c := ra.c
	ra.mu.Lock()
	r := ra.rounds[job]
	if r != nil {
		r.stop = r.stop || stop
		ra.mu.Unlock()
		select {
		case <-r.done:
			return r.ck, r.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	r = &rankRound{done: make(chan struct{}), stop: stop}
	ra.rounds[job] = r
	ra.mu.Unlock()
	unlock := c.locks.lock(job)
	ra.mu.Lock()
	if ra.rounds[job] == r {
		delete(ra.rounds, job) // started: a later ask waits for the next one
	}
	dropped, stop := r.dropped, r.stop
	ra.mu.Unlock()
	if dropped != "" {
		r.err = apiErr(coordv1.CodeConflict, "the checkpoint of job %s that its ranks asked for did not start: %s", job, dropped)
	} else {
		r.ck, r.err = c.rounds.checkpointLocked(context.WithoutCancel(ctx), coordv1.Ckpt{Job: job, Stop: stop})
	}
	unlock()
	close(r.done)
	return r.ck, r.err
}

// RankInfo tells a rank, on node, about its job.
func (c *Coordinator) RankInfo(ctx context.Context, node string, req coordv1.RankRequest) (*coordv1.RankInfo, error) {
	j, err := c.ranks.rankJob(ctx, node, req)
	if err != nil {
		return nil, err
	}
	return &coordv1.RankInfo{Ckpt: j.LastCkpt, Mode: jobMode(j)}, nil
}

// RankEvent publishes an event of a rank, on node: at most rankEventRate
// a second for a job.
func (c *Coordinator) RankEvent(ctx context.Context, node string, req coordv1.RankRequest) error {
	if _, err := c.ranks.rankJob(ctx, node, req); err != nil {
		return err
	}
	if !c.ranks.allowEvent(req.Job) {
		return apiErr(coordv1.CodeRateLimited, "job %s publishes more than %d events a second", req.Job, rankEventRate)
	}
	c.publish(evv1.Event{Type: evv1.RankEvent, Job: req.Job, Rank: evv1.IntPtr(req.Rank), Kind: req.Kind, Message: req.Message})
	return nil
}

// jobMode is a job's mode of checkpointing, never empty.
func jobMode(j *coordv1.Job) string {
	if j.Mode == "" {
		return coordv1.ModeTransparent
	}
	return j.Mode
}

// rankRoutes adds the rank API's routes, for agents only.
func (ra *rankAPI) rankRoutes(route func(string, []pki.Role, http.HandlerFunc)) {
	c := ra.c
	serve := func(fn func(ctx context.Context, node string, req coordv1.RankRequest) (any, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			id := r.Context().Value(callerKey{}).(pki.Identity)
			var req coordv1.RankRequest
			if !decode(w, r, &req) {
				return
			}
			out, err := fn(context.WithoutCancel(r.Context()), id.Name, req)
			status := http.StatusOK
			if out == nil && err == nil {
				status = http.StatusNoContent
			}
			reply(w, status, out, err)
		}
	}
	route("POST "+coordv1.PathRankCheckpoint, agentsOnly, serve(func(ctx context.Context, node string, req coordv1.RankRequest) (any, error) {
		return c.RankCheckpoint(ctx, node, req)
	}))
	route("POST "+coordv1.PathRankInfo, agentsOnly, serve(func(ctx context.Context, node string, req coordv1.RankRequest) (any, error) {
		return c.RankInfo(ctx, node, req)
	}))
	route("POST "+coordv1.PathRankEvent, agentsOnly, serve(func(ctx context.Context, node string, req coordv1.RankRequest) (any, error) {
		return nil, c.RankEvent(ctx, node, req)
	}))
}

// allowEvent tells whether a rank of job may publish an event now.
func (ra *rankAPI) allowEvent(job string) bool {
	ra.mu.Lock()
	l := ra.events[job]
	if l == nil {
		l = rate.NewLimiter(rankEventRate, rankEventBurst)
		ra.events[job] = l
	}
	ra.mu.Unlock()
	return l.Allow()
}

// forget drops what is kept of a removed job.
func (ra *rankAPI) forget(job string) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	delete(ra.events, job)
}
