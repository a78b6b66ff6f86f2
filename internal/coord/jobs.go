package coord

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	agentv1 "cairn/api/agent/v1"
	v1 "cairn/api/coord/v1"
	evv1 "cairn/api/events/v1"
	"cairn/internal/catalog"
	"cairn/internal/failpoint"
	"cairn/internal/launch"
	"cairn/internal/names"
	"cairn/internal/rpc"
)

// validJobName accepts names that make valid container names as JOB.RANK.
func validJobName(name string) error {
	if err := names.Job(name); err != nil {
		return apiErr(agentv1.CodeBadRequest, "%s", err)
	}
	return nil
}

// Jobs lists the jobs.
func (c *Coordinator) Jobs(ctx context.Context) ([]v1.Job, error) {
	var out []v1.Job
	_, err := c.cat.List(ctx, "jobs/", func(_ string, raw []byte) error {
		var j v1.Job
		if err := json.Unmarshal(raw, &j); err != nil {
			return err
		}
		out = append(out, j)
		return nil
	})
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, err
}

func (c *Coordinator) job(ctx context.Context, name string) (*v1.Job, error) {
	var j v1.Job
	if _, err := c.cat.Get(ctx, jobKey(name), &j); err != nil {
		if errors.Is(err, catalog.ErrNotFound) {
			return nil, apiErr(agentv1.CodeNotFound, "no job %s", name)
		}
		return nil, err
	}
	return &j, nil
}

// updateJob changes a job's record with fn under compare-and-swap.
func (c *Coordinator) updateJob(ctx context.Context, name string, fn func(*v1.Job) error) (*v1.Job, error) {
	var j v1.Job
	err := c.cat.Update(ctx, jobKey(name), &j, func() error { return fn(&j) })
	return &j, err
}

// liveNodes returns the live nodes by name.
func (c *Coordinator) liveNodes(ctx context.Context) (map[string]v1.Node, error) {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]v1.Node{}
	for _, n := range nodes {
		if n.Alive {
			out[n.Name] = n
		}
	}
	return out, nil
}

// place puts n ranks on the given candidate nodes (all live nodes if
// none), least loaded first, at most perNode on each (0: as evenly as
// possible). prefer, if set, names a node to keep for a rank when it is a
// candidate.
func place(n, perNode int, cands []v1.Node, prefer []string) ([]string, error) {
	if len(cands) == 0 {
		return nil, apiErr(v1.CodeNoNodes, "no live node to place %d ranks on", n)
	}
	if perNode <= 0 {
		perNode = (n + len(cands) - 1) / len(cands)
	}
	if perNode*len(cands) < n {
		return nil, apiErr(v1.CodeNoNodes, "%d ranks do not fit on %d nodes with at most %d per node", n, len(cands), perNode)
	}
	load := map[string]int{}
	ok := map[string]bool{}
	for _, c := range cands {
		load[c.Name] = c.Ranks
		ok[c.Name] = true
	}
	count := map[string]int{}
	out := make([]string, n)
	for r := range n {
		if r < len(prefer) && ok[prefer[r]] && count[prefer[r]] < perNode {
			out[r] = prefer[r]
			count[prefer[r]]++
		}
	}
	for r := range n {
		if out[r] != "" {
			continue
		}
		best, bestSpare := "", false
		for _, c := range cands {
			if count[c.Name] >= perNode {
				continue
			}
			l, bl := load[c.Name]+count[c.Name], load[best]+count[best]
			// Least loaded first; among equals, a spare (kept for this).
			if best == "" || l < bl || l == bl && c.Spare && !bestSpare {
				best, bestSpare = c.Name, c.Spare
			}
		}
		out[r] = best
		count[best]++
	}
	return out, nil
}

// candidates returns the live nodes among names (all live nodes if none,
// spares only if withSpares), sorted by name; a named node that is not
// alive is an error.
func (c *Coordinator) candidates(ctx context.Context, names []string, withSpares bool) ([]v1.Node, error) {
	live, err := c.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []v1.Node
	if len(names) == 0 {
		for _, n := range live {
			if n.Spare && !withSpares || n.Drained {
				continue
			}
			out = append(out, n)
		}
	} else {
		for _, name := range names {
			n, ok := live[name]
			if !ok {
				return nil, apiErr(v1.CodeNodeDead, "node %s is not a live node of the cluster", name)
			}
			out = append(out, n)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

// allocNet gives a new job a VNI and a /24 of the job subnets.
func (c *Coordinator) allocNet(ctx context.Context) (uint32, netip.Prefix, error) {
	var last uint32
	err := c.cat.Update(ctx, "counters/vni", &last, func() error {
		last++
		return nil
	})
	if errors.Is(err, catalog.ErrNotFound) {
		last = 1
		err = c.cat.Create(ctx, "counters/vni", &last)
		if errors.Is(err, catalog.ErrExists) {
			return c.allocNet(ctx)
		}
	}
	if err != nil {
		return 0, netip.Prefix{}, err
	}
	base := c.opts.JobSubnets.Masked()
	slots := uint32(1) << (24 - base.Bits())
	idx := (last - 1) % slots
	b := base.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += idx << 8
	a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), 0})
	return last, netip.PrefixFrom(a, 24), nil
}

// RunJob places and starts a job's ranks.
func (c *Coordinator) RunJob(ctx context.Context, req v1.RunJob) (*v1.Job, error) {
	if err := validJobName(req.Name); err != nil {
		return nil, err
	}
	if req.Ranks < 1 || req.Ranks > 250 {
		return nil, apiErr(agentv1.CodeBadRequest, "ranks must be 1..250, not %d", req.Ranks)
	}
	if len(req.Args) == 0 {
		return nil, apiErr(agentv1.CodeBadRequest, "no command given")
	}
	if req.MPI != "" {
		if err := launch.CheckKind(req.MPI); err != nil {
			return nil, apiErr(agentv1.CodeBadRequest, "%v", err)
		}
	}
	defer c.lockJob(req.Name)()
	if req.Replicas < 0 {
		return nil, apiErr(agentv1.CodeBadRequest, "replicas must be 0 or more")
	}
	switch req.OnHealthWarning {
	case "":
		req.OnHealthWarning = v1.HealthIgnore
	case v1.HealthIgnore, v1.HealthMigrate, v1.HealthCheckpoint:
	default:
		return nil, apiErr(agentv1.CodeBadRequest, "on-health-warning must be %s, %s or %s, not %q", v1.HealthMigrate, v1.HealthCheckpoint, v1.HealthIgnore, req.OnHealthWarning)
	}
	switch req.OnFailure {
	case "":
		req.OnFailure = v1.OnFailureRestart
	case v1.OnFailureRestart, v1.OnFailureStop:
	default:
		return nil, apiErr(agentv1.CodeBadRequest, "on-failure must be %s or %s, not %q", v1.OnFailureRestart, v1.OnFailureStop, req.OnFailure)
	}
	cands, err := c.candidates(ctx, req.Nodes, false)
	if err != nil {
		return nil, err
	}
	placement, err := place(req.Ranks, req.PerNode, cands, nil)
	if err != nil {
		return nil, err
	}
	vni, subnet, err := c.allocNet(ctx)
	if err != nil {
		return nil, err
	}
	j := &v1.Job{RunJob: req, VNI: vni, Subnet: subnet.String(), Placement: placement,
		State: v1.JobStarting, Created: time.Now().UTC(), NextCkpt: 1}
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
	out, err := c.startRanks(ctx, j)
	if err != nil {
		c.log.Warn("job start failed; removing it", "job", j.Name, "err", err)
		c.teardown(context.WithoutCancel(ctx), j, nil)
		_ = c.cat.Delete(context.WithoutCancel(ctx), jobKey(j.Name))
		return nil, fmt.Errorf("start job %s: %w", j.Name, err)
	}
	return out, nil
}

// startRanks starts every rank of j, which the catalog holds as starting,
// on its node, and records the job running.
func (c *Coordinator) startRanks(ctx context.Context, j *v1.Job) (*v1.Job, error) {
	subnet, err := netip.ParsePrefix(j.Subnet)
	if err != nil {
		return nil, err
	}
	launchEnv, err := launchEnv(j.RunJob, subnet)
	if err != nil {
		return nil, err
	}
	req := j.RunJob
	env := func(r int) []string {
		return append(append([]string{
			"CAIRN_JOB=" + j.Name, "CAIRN_RANK=" + strconv.Itoa(r), "CAIRN_SIZE=" + strconv.Itoa(req.Ranks),
			"CAIRN_PEERS=" + strings.Join(j.Addrs, ","),
		}, launchEnv...), req.Env...)
	}
	err = c.forRanks(ctx, j, func(ctx context.Context, cl *rpc.AgentClient, r int) error {
		_, err := cl.RankRun(ctx, agentv1.RankRun{
			Rank: agentv1.Rank{Job: j.Name, Rank: r}, Net: jobNet(j, j.Placement[r], c.underlays(ctx)),
			Addr: j.Addrs[r], Args: req.Args, Env: env(r), RootFS: req.RootFS, MPI: req.MPI,
			Cwd: req.Cwd, Volumes: req.Volumes, CPUs: req.CPUs, Memory: req.Memory,
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	failpoint.Hold(ctx, "job-before-running", c.log)
	return c.markStarted(ctx, j)
}

// markStarted records a job whose every rank runs as running.
func (c *Coordinator) markStarted(ctx context.Context, j *v1.Job) (*v1.Job, error) {
	c.mu.Lock()
	c.lastRun[j.Name] = time.Now()
	c.mu.Unlock()
	c.log.Info("job started", "job", j.Name, "ranks", j.Ranks, "placement", j.Placement)
	c.publish(evv1.Event{Type: evv1.JobStarted, Job: j.Name, Message: fmt.Sprintf("%d ranks on %s", j.Ranks, strings.Join(j.Placement, ","))})
	return c.updateJob(ctx, j.Name, func(j *v1.Job) error { j.State = v1.JobRunning; return nil })
}

// recoverStarts finishes the job starts an earlier coordinator left: a job
// still starting whose every rank runs is recorded running; any other has
// what it started removed and is started again, as asked (it has no
// checkpoint to lose). Its nodes may not have joined this coordinator
// yet: five attempts, a node lease apart; then the job is failed.
func (c *Coordinator) recoverStarts(ctx context.Context) {
	jobs, err := c.Jobs(ctx)
	if err != nil {
		c.log.Warn("recover job starts", "err", err)
		return
	}
	for _, j := range jobs {
		if j.State != v1.JobStarting {
			continue
		}
		c.log.Info("finishing a job start an earlier coordinator left", "job", j.Name)
		err := c.retry(ctx, j.Name, "finishing a job start failed", func() error { return c.finishStart(ctx, &j) })
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			_, _ = c.updateJob(ctx, j.Name, func(j *v1.Job) error {
				j.State, j.Reason = v1.JobFailed, "its start was cut short and could not be finished: "+err.Error()
				return nil
			})
		}
	}
}

func (c *Coordinator) finishStart(ctx context.Context, j *v1.Job) error {
	defer c.lockJob(j.Name)()
	running := c.forRanks(ctx, j, func(ctx context.Context, cl *rpc.AgentClient, r int) error {
		in, err := cl.Get(ctx, agentv1.RankName(j.Name, r))
		if err == nil && in.Status != "running" {
			err = fmt.Errorf("rank %d is %s", r, in.Status)
		}
		return err
	})
	if running == nil {
		_, err := c.markStarted(ctx, j)
		return err
	}
	c.log.Info("job start: not every rank runs; starting them all again", "job", j.Name, "why", running)
	c.teardown(ctx, j, nil)
	_, err := c.startRanks(ctx, j)
	return err
}

// underlays maps node names to their underlay addresses.
func (c *Coordinator) underlays(ctx context.Context) map[string]string {
	out := map[string]string{}
	_, _ = c.cat.List(ctx, "nodes/", func(_ string, raw []byte) error {
		var n v1.Node
		if json.Unmarshal(raw, &n) == nil {
			out[n.Name] = n.Underlay
		}
		return nil
	})
	return out
}

// jobNet is the job network as node sees it under the job's placement.
func jobNet(j *v1.Job, node string, underlays map[string]string) agentv1.JobNet {
	n := agentv1.JobNet{Job: j.Name, VNI: j.VNI, Subnet: j.Subnet, Remotes: map[string]string{}}
	for r, on := range j.Placement {
		if on != node && underlays[on] != "" {
			n.Remotes[j.Addrs[r]] = underlays[on]
		}
	}
	return n
}

// forRanks runs fn for every rank of j, in parallel, on the agent of the
// rank's node, and joins the errors.
func (c *Coordinator) forRanks(ctx context.Context, j *v1.Job, fn func(context.Context, *rpc.AgentClient, int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(j.Placement))
	for r, node := range j.Placement {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := c.client(ctx, node)
			if err == nil {
				err = fn(ctx, cl, r)
			}
			if err != nil {
				errs[r] = fmt.Errorf("rank %d on %s: %w", r, node, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// teardown removes j's rank containers and job network from the nodes of
// its placement that are alive, and the job network from extra nodes;
// best effort.
func (c *Coordinator) teardown(ctx context.Context, j *v1.Job, extra []string) {
	live, _ := c.liveNodes(ctx)
	_ = c.forRanks(ctx, j, func(ctx context.Context, cl *rpc.AgentClient, r int) error {
		if _, ok := live[j.Placement[r]]; !ok {
			return nil
		}
		return cl.RankRemove(ctx, agentv1.RankRemove{Rank: agentv1.Rank{Job: j.Name, Rank: r}, VNI: j.VNI, Addr: j.Addrs[r]})
	})
	nodes := append(slices.Clone(j.Placement), extra...)
	slices.Sort(nodes)
	for _, n := range slices.Compact(nodes) {
		if _, ok := live[n]; !ok {
			continue
		}
		if cl, err := c.client(ctx, n); err == nil {
			_ = cl.DeleteJobNet(ctx, j.VNI)
		}
	}
}

// Status returns a job with the live state of its ranks.
func (c *Coordinator) Status(ctx context.Context, name string) (*v1.JobStatus, error) {
	j, err := c.job(ctx, name)
	if err != nil {
		return nil, err
	}
	live, err := c.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	st := &v1.JobStatus{Job: *j, RankStates: make([]v1.Rank, len(j.Placement))}
	var wg sync.WaitGroup
	for r, node := range j.Placement {
		rs := &st.RankStates[r]
		*rs = v1.Rank{Rank: r, Node: node, Addr: j.Addrs[r], Status: "unknown"}
		if _, ok := live[node]; !ok {
			rs.Error = "node is not alive"
			continue
		}
		rs.Alive = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := c.client(ctx, node)
			if err != nil {
				rs.Error = err.Error()
				return
			}
			in, err := cl.Get(ctx, agentv1.RankName(j.Name, r))
			switch {
			case hasCode(err, agentv1.CodeNotFound):
				rs.Status = "missing"
			case err != nil:
				rs.Error = err.Error()
			default:
				rs.Status, rs.Pid, rs.ExitCode = string(in.Status), in.Pid, in.ExitCode
			}
		}()
	}
	wg.Wait()
	st.Exited = true
	for _, rs := range st.RankStates {
		switch rs.Status {
		case "exited", "stopped", "checkpointed":
			if rs.ExitCode == nil || *rs.ExitCode != 0 {
				st.Failed = true
			}
		case "missing", "unknown":
			st.Failed = true
		default:
			st.Exited = false
		}
	}
	if st.Failed && !st.Exited {
		// A rank that is gone does not end the wait while others run.
		for _, rs := range st.RankStates {
			if rs.Status == "running" || rs.Status == "paused" || rs.Status == "created" {
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
func (c *Coordinator) KillJob(ctx context.Context, name string, sig syscall.Signal) (*v1.Job, error) {
	if sig == 0 {
		sig = syscall.SIGKILL
	}
	defer c.lockJob(name)()
	j, err := c.job(ctx, name)
	if err != nil {
		return nil, err
	}
	live, _ := c.liveNodes(ctx)
	err = c.forRanks(ctx, j, func(ctx context.Context, cl *rpc.AgentClient, r int) error {
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
		if gerr == nil && in.Status != "running" && in.Status != "paused" && in.Status != "created" {
			return nil
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	c.log.Info("job signalled", "job", name, "signal", unix.SignalName(sig))
	if sig != syscall.SIGKILL {
		return c.job(ctx, name)
	}
	return c.updateJob(ctx, name, func(j *v1.Job) error { j.State = v1.JobKilled; return nil })
}

// RemoveJob removes a job: its ranks, its network, its catalog records and
// its rank images on every live node (the store reclaims their chunks at
// its gc). Without force, a job with checkpoints or running ranks is
// refused and nothing is touched.
func (c *Coordinator) RemoveJob(ctx context.Context, name string, force bool) (*v1.Removed, error) {
	defer c.lockJob(name)()
	j, err := c.job(ctx, name)
	if err != nil {
		return nil, err
	}
	cks, err := c.ckpts(ctx, name)
	if err != nil {
		return nil, err
	}
	if !force {
		if len(cks) > 0 {
			return nil, apiErr(v1.CodeConflict, "job %s has %d checkpoints (%d to %d), which rm deletes on every node: use --force to remove the job with them", name, len(cks), cks[0].Seq, cks[len(cks)-1].Seq)
		}
		if j.State == v1.JobRunning {
			st, err := c.Status(ctx, name)
			if err != nil {
				return nil, err
			}
			for _, r := range st.RankStates {
				if r.Status == "running" || r.Status == "paused" || r.Status == "created" {
					return nil, apiErr(v1.CodeConflict, "job %s is running (rank %d on %s): use --force to kill and remove it", name, r.Rank, r.Node)
				}
			}
		}
	}
	out := &v1.Removed{Job: name, Ranks: len(j.Placement), Ckpts: len(cks)}
	c.teardown(ctx, j, nil)
	// Rank images are on their nodes and on replicas: every live node
	// drops the job's.
	var ranks []string
	for r := range j.Placement {
		ranks = append(ranks, agentv1.RankName(name, r))
	}
	if live, err := c.liveNodes(ctx); err == nil {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for n := range live {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if cl, err := c.client(ctx, n); err == nil {
					d, err := cl.DropImages(ctx, agentv1.DropImages{Containers: ranks})
					if err != nil {
						c.log.Warn("drop a removed job's images", "job", name, "node", n, "err", err)
					}
					mu.Lock()
					out.Images += d.Images
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	for _, prefix := range []string{ckptPrefix(name), migPrefix(name)} {
		if _, err := c.cat.DeletePrefix(ctx, prefix); err != nil {
			return nil, err
		}
	}
	c.log.Info("job removed", "job", name, "ckpts", out.Ckpts, "images", out.Images)
	return out, c.cat.Delete(ctx, jobKey(name))
}

// launchEnv returns the environment an MPI job's ranks get besides every
// job's: the job's network, for the launcher's interfaces, and a fresh
// secret that authenticates the ranks to each other's launch daemons.
func launchEnv(req v1.RunJob, subnet netip.Prefix) ([]string, error) {
	if req.MPI == "" {
		return nil, nil
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	return []string{
		launch.EnvMPI + "=" + req.MPI,
		launch.EnvSubnet + "=" + subnet.String(),
		launch.EnvSecret + "=" + hex.EncodeToString(secret),
	}, nil
}
