package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/launch"
	"github.com/cairn-hpc/cairn/internal/names"
)

// validJobName accepts names that make valid container names as JOB.RANK.
func validJobName(name string) error {
	if err := names.Job(name); err != nil {
		return apiErr(agentv1.CodeBadRequest, "%s", err)
	}
	return nil
}

// Jobs lists the jobs.
func (c *Coordinator) Jobs(ctx context.Context) ([]coordv1.Job, error) {
	var out []coordv1.Job
	_, err := c.cat.List(ctx, "jobs/", func(_ string, raw []byte) error {
		var j coordv1.Job
		if err := json.Unmarshal(raw, &j); err != nil {
			return err
		}
		out = append(out, j)
		return nil
	})
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, err
}

// RunJob places and starts a job's ranks.
func (c *Coordinator) RunJob(ctx context.Context, req coordv1.RunJob) (*coordv1.Job, error) {
	if err := validJobName(req.Name); err != nil {
		return nil, err
	}
	if req.Ranks < 1 || req.Ranks > MaxRanks {
		return nil, apiErr(agentv1.CodeBadRequest, "ranks must be 1..%d, not %d", MaxRanks, req.Ranks)
	}
	if len(req.Args) == 0 {
		return nil, apiErr(agentv1.CodeBadRequest, "no command given")
	}
	if req.MPI != "" {
		if err := launch.CheckKind(req.MPI); err != nil {
			return nil, apiErr(agentv1.CodeBadRequest, "%v", err)
		}
	}
	switch req.Mode {
	case "", coordv1.ModeTransparent, coordv1.ModeApp:
	default:
		return nil, apiErr(agentv1.CodeBadRequest, "mode must be %s or %s, not %q", coordv1.ModeTransparent, coordv1.ModeApp, req.Mode)
	}
	if req.Mode == coordv1.ModeApp && req.LazyRestore {
		return nil, apiErr(agentv1.CodeBadRequest, "an application-level job has no memory to restore lazily")
	}
	if err := c.intervals.checkAuto(ctx, req); err != nil {
		return nil, err
	}
	defer c.locks.lock(req.Name)()
	if req.Replicas < 0 {
		return nil, apiErr(agentv1.CodeBadRequest, "replicas must be 0 or more")
	}
	if req.Keep < 0 {
		return nil, apiErr(agentv1.CodeBadRequest, "keep must be 0 (every checkpoint) or more")
	}
	if req.FlushEvery < 0 || req.FlushEvery > 0 && req.Tier == "" {
		return nil, apiErr(agentv1.CodeBadRequest, "flush-every must be 0 or more, and needs a durable tier (--tier URL)")
	}
	if req.Tier != "" {
		if err := checkTierURL(req.Tier); err != nil {
			return nil, err
		}
	}
	switch req.OnHealthWarning {
	case "":
		req.OnHealthWarning = coordv1.HealthIgnore
	case coordv1.HealthIgnore, coordv1.HealthMigrate, coordv1.HealthCheckpoint:
	default:
		return nil, apiErr(agentv1.CodeBadRequest, "on-health-warning must be %s, %s or %s, not %q", coordv1.HealthMigrate, coordv1.HealthCheckpoint, coordv1.HealthIgnore, req.OnHealthWarning)
	}
	switch req.OnFailure {
	case "":
		req.OnFailure = coordv1.OnFailureRestart
	case coordv1.OnFailureRestart, coordv1.OnFailureStop:
	default:
		return nil, apiErr(agentv1.CodeBadRequest, "on-failure must be %s or %s, not %q", coordv1.OnFailureRestart, coordv1.OnFailureStop, req.OnFailure)
	}
	cands, err := c.rec.candidates(ctx, req.Nodes, false)
	if err != nil {
		return nil, err
	}
	placement, err := place(req.Ranks, req.PerNode, cands, nil)
	if err != nil {
		return nil, err
	}
	vni, subnet, err := c.rec.allocNet(ctx, req.Ranks)
	if err != nil {
		return nil, err
	}
	j := &coordv1.Job{RunJob: req, VNI: vni, Subnet: subnet.String(), Placement: placement,
		State: coordv1.JobStarting, Created: time.Now().UTC(), NextCkpt: 1, CPU: cpuOf(cands, placement)}
	a := subnet.Addr().Next() // .1 stays free
	for range req.Ranks {
		a = a.Next()
		j.Addrs = append(j.Addrs, a.String())
	}
	if err := c.cat.Create(ctx, jobKey(j.Name), j); err != nil {
		if errors.Is(err, catalog.ErrExists) {
			return nil, apiErr(agentv1.CodeExists, "job %s exists; remove it first (cairn rm %s)", j.Name, j.Name)
		}
		return nil, err
	}
	done, err := c.runs.startJob(ctx, j, false)
	if err != nil {
		return nil, fmt.Errorf("start job %s: %w", j.Name, err)
	}
	if !done.OK {
		return nil, fmt.Errorf("start job %s: %w", j.Name, doneErr(done))
	}
	return c.rec.job(ctx, j.Name)
}

// teardown removes j's rank containers and job network from the nodes of
// its placement that are alive, and the job network from extra nodes;
// best effort.
func (jr *jobRuns) teardown(ctx context.Context, j *coordv1.Job, extra []string) {
	c := jr.c
	live, _ := c.rec.liveNodes(ctx)
	_ = c.agents.onRanks(ctx, j.Placement, func(r int, cl Agent) error {
		if _, ok := live[j.Placement[r]]; !ok {
			return nil
		}
		return cl.RankRemove(ctx, agentv1.RankRemove{Rank: agentv1.Rank{Job: j.Name, Rank: r}, VNI: j.VNI, Addr: j.Addrs[r]})
	})
	nodes := append(slices.Clone(j.Placement), extra...)
	slices.Sort(nodes)
	nodes = slices.DeleteFunc(slices.Compact(nodes), func(n string) bool { _, ok := live[n]; return !ok })
	_ = c.agents.onNodes(ctx, nodes, func(_ string, cl Agent) error { return cl.DeleteJobNet(ctx, j.VNI) })
}

// Status returns a job with the live state of its ranks.
func (c *Coordinator) Status(ctx context.Context, name string) (*coordv1.JobStatus, error) {
	j, err := c.rec.job(ctx, name)
	if err != nil {
		return nil, err
	}
	live, err := c.rec.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	st := &coordv1.JobStatus{Job: *j, RankStates: make([]coordv1.Rank, len(j.Placement))}
	for r, node := range j.Placement {
		st.RankStates[r] = coordv1.Rank{Rank: r, Node: node, Addr: j.Addrs[r], Status: coordv1.RankUnknown}
		if _, ok := live[node]; !ok {
			st.RankStates[r].Error = "node is not alive"
		} else {
			st.RankStates[r].Alive = true
		}
	}
	_ = c.agents.onRanks(ctx, j.Placement, func(r int, cl Agent) error {
		rs := &st.RankStates[r]
		if !rs.Alive {
			return nil
		}
		in, err := cl.Get(ctx, agentv1.RankName(j.Name, r))
		switch {
		case hasCode(err, agentv1.CodeNotFound):
			rs.Status = coordv1.RankMissing
		case err != nil:
			rs.Error = err.Error()
		default:
			rs.Status, rs.Pid, rs.ExitCode, rs.EndedBy = in.Status, in.Pid, in.ExitCode, in.EndedBy
		}
		return nil
	})
	st.Exited = true
	for _, rs := range st.RankStates {
		switch rs.Status {
		case agentv1.StatusExited, agentv1.StatusStopped, agentv1.StatusCheckpointed:
			if rs.ExitCode == nil || *rs.ExitCode != 0 {
				st.Failed = true
			}
		case coordv1.RankMissing, coordv1.RankUnknown:
			st.Failed = true
		default:
			st.Exited = false
		}
	}
	if j.State == coordv1.JobRunning && slices.ContainsFunc(st.RankStates, func(rs coordv1.Rank) bool { return rs.EndedBy != "" }) {
		// A rank its node ended (its memory could not be fetched) is for
		// the job's failure policy, which restarts the job or ends it:
		// the job is not over until then.
		st.Exited = false
		return st, nil
	}
	if st.Failed && !st.Exited {
		// A rank that is gone does not end the wait while others run.
		for _, rs := range st.RankStates {
			if agentv1.Status(rs.Status).Active() {
				return st, nil
			}
		}
		st.Exited = true
	}
	return st, nil
}

// KillJob sends sig to every rank's processes (0: SIGKILL); the job and
// its checkpoints stay. After SIGKILL the job is "killed"; after another
// signal its state follows what its ranks do.
func (c *Coordinator) KillJob(ctx context.Context, name string, sig syscall.Signal) (*coordv1.Job, error) {
	if sig == 0 {
		sig = syscall.SIGKILL
	}
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		c.ranks.dropRankRound(name, "the job was killed")
	}
	defer c.locks.lock(name)()
	j, err := c.rec.job(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := c.runs.signalRanks(ctx, j, sig); err != nil {
		return nil, err
	}
	c.log.Info("job signalled", "job", name, "signal", unix.SignalName(sig))
	if sig != syscall.SIGKILL {
		return c.rec.job(ctx, name)
	}
	return c.rec.updateJob(ctx, name, func(j *coordv1.Job) error { j.State = coordv1.JobKilled; return nil })
}

// signalRanks sends sig to the processes of every rank of j on a live
// node; a rank that has already ended is signalled enough. The caller
// holds the job's lock.
func (jr *jobRuns) signalRanks(ctx context.Context, j *coordv1.Job, sig syscall.Signal) error {
	c := jr.c
	live, _ := c.rec.liveNodes(ctx)
	return c.agents.onRanks(ctx, j.Placement, func(r int, cl Agent) error {
		if _, ok := live[j.Placement[r]]; !ok {
			return nil
		}
		name := agentv1.RankName(j.Name, r)
		err := cl.Kill(ctx, name, int(sig))
		if err == nil {
			return nil
		}
		// A rank that has already ended is killed enough.
		in, gerr := cl.Get(ctx, name)
		if hasCode(gerr, agentv1.CodeNotFound) {
			return nil
		}
		if gerr == nil && !in.Status.Live() {
			return nil
		}
		return err
	})
}

// RemoveJob removes a job: its ranks, its network, its catalog records and
// its rank images on every live node (the store reclaims their chunks at
// its gc). Without force, a job with checkpoints or running ranks is
// refused and nothing is touched.
func (c *Coordinator) RemoveJob(ctx context.Context, name string, force bool) (*coordv1.Removed, error) {
	c.ranks.dropRankRound(name, "the job was removed")
	defer c.locks.lock(name)()
	j, err := c.rec.job(ctx, name)
	if err != nil {
		return nil, err
	}
	cks, err := c.rec.ckpts(ctx, name)
	if err != nil {
		return nil, err
	}
	if !force {
		if len(cks) > 0 {
			return nil, apiErr(coordv1.CodeConflict, "job %s has %d checkpoints (%d to %d), which rm deletes on every node: use --force to remove the job with them", name, len(cks), cks[0].Seq, cks[len(cks)-1].Seq)
		}
		if j.State == coordv1.JobRunning {
			st, err := c.Status(ctx, name)
			if err != nil {
				return nil, err
			}
			for _, r := range st.RankStates {
				if agentv1.Status(r.Status).Live() {
					return nil, apiErr(coordv1.CodeConflict, "job %s is running (rank %d on %s): use --force to kill and remove it", name, r.Rank, r.Node)
				}
			}
		}
	}
	out := &coordv1.Removed{Job: name, Ranks: len(j.Placement), Ckpts: len(cks)}
	c.runs.teardown(ctx, j, nil)
	// Rank images are on their nodes and on replicas: every live node
	// drops the job's.
	var ranks []string
	for r := range j.Placement {
		ranks = append(ranks, agentv1.RankName(name, r))
	}
	if live, err := c.rec.liveNodes(ctx); err == nil {
		var mu sync.Mutex
		err := c.agents.onNodes(ctx, slices.Sorted(maps.Keys(live)), func(_ string, cl Agent) error {
			d, err := cl.DropImages(ctx, agentv1.DropImages{Containers: ranks})
			mu.Lock()
			out.Images += d.Images
			mu.Unlock()
			return err
		})
		if err != nil {
			c.log.Warn("drop a removed job's images", "job", name, "err", err)
		}
	}
	for _, prefix := range []string{ckptPrefix(name), migPrefix(name)} {
		if _, err := c.cat.DeletePrefix(ctx, prefix); err != nil {
			return nil, err
		}
	}
	c.ranks.forget(name) // its ranks' event limiter
	c.log.Info("job removed", "job", name, "ckpts", out.Ckpts, "images", out.Images)
	return out, c.cat.Delete(ctx, jobKey(name))
}
