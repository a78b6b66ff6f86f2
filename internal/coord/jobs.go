package coord

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
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
	coordv1 "cairn/api/coord/v1"
	evv1 "cairn/api/events/v1"
	"cairn/internal/catalog"
	"cairn/internal/coord/machine"
	"cairn/internal/launch"
	"cairn/internal/names"
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

func (c *Coordinator) job(ctx context.Context, name string) (*coordv1.Job, error) {
	var j coordv1.Job
	if _, err := c.cat.Get(ctx, jobKey(name), &j); err != nil {
		if errors.Is(err, catalog.ErrNotFound) {
			return nil, apiErr(agentv1.CodeNotFound, "no job %s", name)
		}
		return nil, err
	}
	return &j, nil
}

// updateJob changes a job's record with fn under compare-and-swap.
func (c *Coordinator) updateJob(ctx context.Context, name string, fn func(*coordv1.Job) error) (*coordv1.Job, error) {
	var j coordv1.Job
	err := c.cat.Update(ctx, jobKey(name), &j, func() error { return fn(&j) })
	return &j, err
}

// liveNodes returns the live nodes by name.
func (c *Coordinator) liveNodes(ctx context.Context) (map[string]coordv1.Node, error) {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]coordv1.Node{}
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
func place(n, perNode int, cands []coordv1.Node, prefer []string) ([]string, error) {
	if len(cands) == 0 {
		return nil, apiErr(coordv1.CodeNoNodes, "no live node to place %d ranks on", n)
	}
	if perNode <= 0 {
		perNode = (n + len(cands) - 1) / len(cands)
	}
	if perNode*len(cands) < n {
		return nil, apiErr(coordv1.CodeNoNodes, "%d ranks do not fit on %d nodes with at most %d per node", n, len(cands), perNode)
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
func (c *Coordinator) candidates(ctx context.Context, names []string, withSpares bool) ([]coordv1.Node, error) {
	live, err := c.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []coordv1.Node
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
				return nil, apiErr(coordv1.CodeNodeDead, "node %s is not a live node of the cluster", name)
			}
			out = append(out, n)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

// MaxRanks is the most ranks a job may have: a /18 of addresses, less
// the network's, the first host's and the broadcast address.
const MaxRanks = 1<<14 - 3

// allocNet gives a new job a VNI and a subnet of the job subnets with room
// for ranks addresses beside the network's, the first host's (kept free)
// and the broadcast address: a /24, or a larger block of /24s (aligned on
// its size) for a job of more than 253 ranks.
func (c *Coordinator) allocNet(ctx context.Context, ranks int) (uint32, netip.Prefix, error) {
	var vni uint32
	err := c.cat.Update(ctx, "counters/vni", &vni, func() error { vni++; return nil })
	if errors.Is(err, catalog.ErrNotFound) {
		vni = 1
		if err = c.cat.Create(ctx, "counters/vni", &vni); errors.Is(err, catalog.ErrExists) {
			return c.allocNet(ctx, ranks)
		}
	}
	if err != nil {
		return 0, netip.Prefix{}, err
	}
	bits := 24
	for 1<<(32-bits) < ranks+3 {
		bits--
	}
	blocks := uint32(1) << (24 - bits) // /24s in the job's subnet
	base := c.opts.JobSubnets.Masked()
	if base.Bits() > bits {
		return 0, netip.Prefix{}, apiErr(agentv1.CodeBadRequest, "%d ranks need a /%d: the job subnets %s are smaller", ranks, bits, base)
	}
	// counters/subnet counts the /24s given out; a job's block starts at
	// the next multiple of its size. Clusters from before jobs could be
	// larger than a /24 gave one /24 per VNI.
	var used, start uint32
	take := func() error {
		start = (used + blocks - 1) / blocks * blocks
		used = start + blocks
		return nil
	}
	err = c.cat.Update(ctx, "counters/subnet", &used, take)
	if errors.Is(err, catalog.ErrNotFound) {
		used = vni - 1
		_ = take()
		if err = c.cat.Create(ctx, "counters/subnet", &used); errors.Is(err, catalog.ErrExists) {
			err = c.cat.Update(ctx, "counters/subnet", &used, take)
		}
	}
	if err != nil {
		return 0, netip.Prefix{}, err
	}
	idx := start % (uint32(1) << (24 - base.Bits()))
	b := base.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += idx << 8
	a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), 0})
	return vni, netip.PrefixFrom(a, bits), nil
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
	defer c.lockJob(req.Name)()
	if req.Replicas < 0 {
		return nil, apiErr(agentv1.CodeBadRequest, "replicas must be 0 or more")
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
	cands, err := c.candidates(ctx, req.Nodes, false)
	if err != nil {
		return nil, err
	}
	placement, err := place(req.Ranks, req.PerNode, cands, nil)
	if err != nil {
		return nil, err
	}
	vni, subnet, err := c.allocNet(ctx, req.Ranks)
	if err != nil {
		return nil, err
	}
	j := &coordv1.Job{RunJob: req, VNI: vni, Subnet: subnet.String(), Placement: placement,
		State: coordv1.JobStarting, Created: time.Now().UTC(), NextCkpt: 1}
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
	done, err := c.startJob(ctx, j, false)
	if err != nil {
		return nil, fmt.Errorf("start job %s: %w", j.Name, err)
	}
	if !done.OK {
		c.log.Warn("job start failed; removed it", "job", j.Name, "err", done.Reason)
		return nil, fmt.Errorf("start job %s: %s", j.Name, done.Reason)
	}
	return c.job(ctx, j.Name)
}

// startJob runs the start of j, which the catalog holds as starting, to
// its end (machine.JobStart); recover says that an earlier coordinator
// died during it.
func (c *Coordinator) startJob(ctx context.Context, j *coordv1.Job, recover bool) (machine.Done, error) {
	m, err := machine.NewStart(machine.StartConfig{Job: j.Name, Placement: j.Placement, Recover: recover})
	if err != nil {
		return machine.Done{}, err
	}
	subnet, err := netip.ParsePrefix(j.Subnet)
	if err != nil {
		return machine.Done{}, err
	}
	launchEnv, err := launchEnv(j.RunJob, subnet)
	if err != nil {
		return machine.Done{}, err
	}
	x, err := c.newJobRun(ctx, j, c.log.With("job", j.Name))
	if err != nil {
		return machine.Done{}, err
	}
	req := j.RunJob
	peers := "CAIRN_PEERS=" + strings.Join(j.Addrs, ",")
	x.run = func(r int) agentv1.RankRun {
		env := append(append([]string{
			"CAIRN_JOB=" + j.Name, "CAIRN_RANK=" + strconv.Itoa(r), "CAIRN_SIZE=" + strconv.Itoa(req.Ranks), peers,
		}, launchEnv...), req.Env...)
		return agentv1.RankRun{
			Rank: agentv1.Rank{Job: j.Name, Rank: r}, Net: x.ownNet(j.Placement[r]),
			Addr: j.Addrs[r], Args: req.Args, Env: env, RootFS: req.RootFS, MPI: req.MPI,
			Cwd: req.Cwd, Volumes: req.Volumes, CPUs: req.CPUs, Memory: req.Memory,
		}
	}
	x.persist = func(ctx context.Context, p machine.Persist) error {
		switch p.Phase {
		case machine.PhaseRunning:
			return c.markStarted(ctx, j)
		case machine.PhaseRemoved:
			return c.cat.Delete(ctx, jobKey(j.Name))
		}
		return fmt.Errorf("job start: no phase %s", p.Phase)
	}
	return x.drive(ctx, m)
}

// markStarted records a job whose every rank runs as running.
func (c *Coordinator) markStarted(ctx context.Context, j *coordv1.Job) error {
	if _, err := c.updateJob(ctx, j.Name, func(j *coordv1.Job) error { j.State = coordv1.JobRunning; return nil }); err != nil {
		return err
	}
	c.mu.Lock()
	c.lastRun[j.Name] = time.Now()
	c.mu.Unlock()
	c.log.Info("job started", "job", j.Name, "ranks", j.Ranks, "placement", j.Placement)
	c.publish(evv1.Event{Type: evv1.JobStarted, Job: j.Name, Message: fmt.Sprintf("%d ranks on %s", j.Ranks, strings.Join(j.Placement, ","))})
	return nil
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
		if j.State != coordv1.JobStarting {
			continue
		}
		c.log.Info("finishing a job start an earlier coordinator left", "job", j.Name)
		err := c.retry(ctx, j.Name, "finishing a job start failed", func() error {
			defer c.lockJob(j.Name)()
			done, err := c.startJob(ctx, &j, true)
			if err == nil {
				err = doneErr(done)
			}
			return err
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			_, _ = c.updateJob(ctx, j.Name, func(j *coordv1.Job) error {
				j.State, j.Reason = coordv1.JobFailed, "its start was cut short and could not be finished: "+err.Error()
				return nil
			})
		}
	}
}

// jobNet is the job network as node sees it under the job's placement.
func jobNet(j *coordv1.Job, node string, underlays map[string]string) agentv1.JobNet {
	n := agentv1.JobNet{Job: j.Name, VNI: j.VNI, Subnet: j.Subnet, Remotes: map[string]string{}}
	for r, on := range j.Placement {
		if on != node && underlays[on] != "" {
			n.Remotes[j.Addrs[r]] = underlays[on]
		}
	}
	return n
}

// teardown removes j's rank containers and job network from the nodes of
// its placement that are alive, and the job network from extra nodes;
// best effort.
func (c *Coordinator) teardown(ctx context.Context, j *coordv1.Job, extra []string) {
	live, _ := c.liveNodes(ctx)
	_ = c.onRanks(ctx, j.Placement, func(r int, cl Agent) error {
		if _, ok := live[j.Placement[r]]; !ok {
			return nil
		}
		return cl.RankRemove(ctx, agentv1.RankRemove{Rank: agentv1.Rank{Job: j.Name, Rank: r}, VNI: j.VNI, Addr: j.Addrs[r]})
	})
	nodes := append(slices.Clone(j.Placement), extra...)
	slices.Sort(nodes)
	nodes = slices.DeleteFunc(slices.Compact(nodes), func(n string) bool { _, ok := live[n]; return !ok })
	_ = c.onNodes(ctx, nodes, func(_ string, cl Agent) error { return cl.DeleteJobNet(ctx, j.VNI) })
}

// Status returns a job with the live state of its ranks.
func (c *Coordinator) Status(ctx context.Context, name string) (*coordv1.JobStatus, error) {
	j, err := c.job(ctx, name)
	if err != nil {
		return nil, err
	}
	live, err := c.liveNodes(ctx)
	if err != nil {
		return nil, err
	}
	st := &coordv1.JobStatus{Job: *j, RankStates: make([]coordv1.Rank, len(j.Placement))}
	for r, node := range j.Placement {
		st.RankStates[r] = coordv1.Rank{Rank: r, Node: node, Addr: j.Addrs[r], Status: "unknown"}
		if _, ok := live[node]; !ok {
			st.RankStates[r].Error = "node is not alive"
		} else {
			st.RankStates[r].Alive = true
		}
	}
	_ = c.onRanks(ctx, j.Placement, func(r int, cl Agent) error {
		rs := &st.RankStates[r]
		if !rs.Alive {
			return nil
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
		return nil
	})
	st.Exited = true
	for _, rs := range st.RankStates {
		switch rs.Status {
		case string(agentv1.StatusExited), string(agentv1.StatusStopped), string(agentv1.StatusCheckpointed):
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
	defer c.lockJob(name)()
	j, err := c.job(ctx, name)
	if err != nil {
		return nil, err
	}
	live, _ := c.liveNodes(ctx)
	err = c.onRanks(ctx, j.Placement, func(r int, cl Agent) error {
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
	if err != nil {
		return nil, err
	}
	c.log.Info("job signalled", "job", name, "signal", unix.SignalName(sig))
	if sig != syscall.SIGKILL {
		return c.job(ctx, name)
	}
	return c.updateJob(ctx, name, func(j *coordv1.Job) error { j.State = coordv1.JobKilled; return nil })
}

// RemoveJob removes a job: its ranks, its network, its catalog records and
// its rank images on every live node (the store reclaims their chunks at
// its gc). Without force, a job with checkpoints or running ranks is
// refused and nothing is touched.
func (c *Coordinator) RemoveJob(ctx context.Context, name string, force bool) (*coordv1.Removed, error) {
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
	c.teardown(ctx, j, nil)
	// Rank images are on their nodes and on replicas: every live node
	// drops the job's.
	var ranks []string
	for r := range j.Placement {
		ranks = append(ranks, agentv1.RankName(name, r))
	}
	if live, err := c.liveNodes(ctx); err == nil {
		var mu sync.Mutex
		err := c.onNodes(ctx, slices.Sorted(maps.Keys(live)), func(_ string, cl Agent) error {
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
	c.log.Info("job removed", "job", name, "ckpts", out.Ckpts, "images", out.Images)
	return out, c.cat.Delete(ctx, jobKey(name))
}

// launchEnv returns the environment an MPI job's ranks get besides every
// job's: the job's network, for the launcher's interfaces, and a fresh
// secret that authenticates the ranks to each other's launch daemons.
func launchEnv(req coordv1.RunJob, subnet netip.Prefix) ([]string, error) {
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
