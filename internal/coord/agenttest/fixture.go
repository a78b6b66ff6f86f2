package agenttest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// Every case runs one job, on one job network of its fresh nodes.
const (
	job    = "conform"
	vni    = 4242
	subnet = "10.77.0.0/24"
	// long is the hold of calls whose end no case waits for.
	long = 2 * time.Minute
	// callTimeout bounds every call, so that an agent that hangs fails
	// its case rather than the test binary.
	callTimeout = time.Minute
)

// silent is a node that is in no Env, whose agent nobody answers for:
// nothing listens on its address.
var silent = Node{Name: "silent", Addr: "127.0.0.1:1"}

// addr is rank r's address on the job network.
func addr(r int) string { return fmt.Sprintf("10.77.0.%d", 10+r) }

func rank(r int) agentv1.Rank { return agentv1.Rank{Job: job, Rank: r} }

func ranks(rs ...int) []agentv1.Rank {
	out := make([]agentv1.Rank, len(rs))
	for i, r := range rs {
		out[i] = rank(r)
	}
	return out
}

// name is rank r's container.
func name(r int) string { return agentv1.RankName(job, r) }

// fixture is one case: its nodes, and helpers that call their agents and
// look at their ranks.
type fixture struct {
	t     *testing.T
	env   Env
	nodes []Node
}

func newFixture(t *testing.T, env Env) *fixture {
	t.Helper()
	nodes := env.Nodes(t)
	if len(nodes) < 2 {
		t.Fatalf("the env gave %d nodes, the suite needs 2", len(nodes))
	}
	f := &fixture{t: t, env: env, nodes: nodes}
	t.Cleanup(f.cleanup)
	return f
}

// cleanup removes what the case left through the agent API (a rank that
// stays prepared would otherwise wait for its hold), ranks first, then
// the job network.
func (f *fixture) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	for _, n := range f.nodes {
		for r := range 3 {
			if err := n.Agent.RankRemove(ctx, agentv1.RankRemove{Rank: rank(r), VNI: vni, Addr: addr(r)}); err != nil {
				f.t.Errorf("cleanup: remove %s on %s: %v", name(r), n.Name, err)
			}
		}
		if err := n.Agent.DeleteJobNet(ctx, vni); err != nil {
			f.t.Errorf("cleanup: drop the job network on %s: %v", n.Name, err)
		}
	}
}

func (f *fixture) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), callTimeout)
}

// agent is node n's agent.
func (f *fixture) agent(n int) Agent { return f.nodes[n].Agent }

// jobNet is the job network as node n sees it, with the ranks of remotes
// (rank to node) on other nodes.
func (f *fixture) jobNet(n int, remotes map[int]int) agentv1.JobNet {
	j := agentv1.JobNet{Job: job, VNI: vni, Subnet: subnet, Remotes: map[string]string{}}
	for r, on := range remotes {
		j.Remotes[addr(r)] = f.nodes[on].Underlay
	}
	return j
}

func (f *fixture) rankRun(n, r int) (agentv1.Container, error) { return f.rankRunAt(n, r, addr(r)) }

// rankRunAt starts rank r on node n at address at.
func (f *fixture) rankRunAt(n, r int, at string) (agentv1.Container, error) {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).RankRun(ctx, agentv1.RankRun{Rank: rank(r), Net: f.jobNet(n, nil), Addr: at, Args: f.env.Args, RootFS: f.env.RootFS})
}

// run starts rank r on node n, and checks what RankRun answers.
func (f *fixture) run(n, r int) {
	f.t.Helper()
	ct, err := f.rankRun(n, r)
	mustOK(f.t, err, "run %s", name(r))
	if ct.Name != name(r) || ct.Status != agentv1.StatusRunning || ct.Addr != addr(r) {
		f.t.Errorf("run %s answered %s %s at %s, want %s running at %s", name(r), ct.Name, ct.Status, ct.Addr, name(r), addr(r))
	}
	f.want(n, r, running)
}

func (f *fixture) get(n, r int) (agentv1.Container, error) {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).Get(ctx, name(r))
}

func (f *fixture) stall(n int, hold time.Duration, rs ...int) error {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).RankStall(ctx, agentv1.RankStall{Ranks: ranks(rs...), Hold: hold})
}

func (f *fixture) resume(n int, rs ...int) error {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).RankResume(ctx, agentv1.RankResume{Ranks: ranks(rs...)})
}

func (f *fixture) tryPrepare(n, r, seq int, hold time.Duration) (agentv1.Prepared, error) {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).Prepare(ctx, agentv1.Prepare{Rank: rank(r), Seq: seq, Hold: hold})
}

// prepare prepares rank r on node n as checkpoint seq, and checks that it
// is frozen with its network locked.
func (f *fixture) prepare(n, r, seq int, hold time.Duration) {
	f.t.Helper()
	p, err := f.tryPrepare(n, r, seq, hold)
	mustOK(f.t, err, "prepare %s:%d", name(r), seq)
	if p.Size <= 0 {
		f.t.Errorf("prepare %s:%d staged %d bytes", name(r), seq, p.Size)
	}
	f.want(n, r, frozen)
}

func (f *fixture) tryCommit(n, r, seq int) (agentv1.Committed, error) {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).Commit(ctx, agentv1.Finish{Rank: rank(r), Seq: seq})
}

func (f *fixture) tryCommitStop(n, r, seq int) (agentv1.Committed, error) {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).Commit(ctx, agentv1.Finish{Rank: rank(r), Seq: seq, Stop: true})
}

// commit commits checkpoint seq of rank r on node n, and checks that its
// answer names the checkpoint.
func (f *fixture) commit(n, r, seq int) agentv1.Committed {
	f.t.Helper()
	c, err := f.tryCommit(n, r, seq)
	mustOK(f.t, err, "commit %s:%d", name(r), seq)
	return f.committed(c, r, seq)
}

// commitStop commits checkpoint seq of rank r on node n with Stop, and
// checks that its answer names the checkpoint.
func (f *fixture) commitStop(n, r, seq int) agentv1.Committed {
	f.t.Helper()
	c, err := f.tryCommitStop(n, r, seq)
	mustOK(f.t, err, "commit %s:%d and stop", name(r), seq)
	return f.committed(c, r, seq)
}

func (f *fixture) committed(c agentv1.Committed, r, seq int) agentv1.Committed {
	f.t.Helper()
	if c.Container != name(r) || c.Seq != seq || c.Size <= 0 {
		f.t.Errorf("commit %s:%d answered checkpoint %s:%d of %d bytes", name(r), seq, c.Container, c.Seq, c.Size)
	}
	return c
}

func (f *fixture) abort(n, r, seq int) error {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).Abort(ctx, agentv1.Finish{Rank: rank(r), Seq: seq})
}

// checkpoint prepares and commits checkpoint seq of rank r on node n.
func (f *fixture) checkpoint(n, r, seq int) {
	f.t.Helper()
	f.prepare(n, r, seq, long)
	f.commit(n, r, seq)
	f.want(n, r, running)
}

func (f *fixture) restore(n, r, seq int) (agentv1.Container, error) {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).RankRestore(ctx, agentv1.RankRestore{Rank: rank(r), Net: f.jobNet(n, nil), Addr: addr(r), Seq: seq})
}

// restored restores rank r on node n from checkpoint seq, and checks
// that it is frozen, its network locked, and says where it comes from.
func (f *fixture) restored(n, r, seq int) {
	f.t.Helper()
	ct, err := f.restore(n, r, seq)
	mustOK(f.t, err, "restore %s:%d", name(r), seq)
	from := fmt.Sprintf("%s:%d", name(r), seq)
	if ct.Name != name(r) || ct.Status != agentv1.StatusPaused || ct.Addr != addr(r) || ct.RestoredFrom != from {
		f.t.Errorf("restore %s:%d answered %s %s at %s from %q, want %s paused at %s from %q",
			name(r), seq, ct.Name, ct.Status, ct.Addr, ct.RestoredFrom, name(r), addr(r), from)
	}
	f.want(n, r, frozen)
}

func (f *fixture) remove(n, r int, keep bool) error {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).RankRemove(ctx, agentv1.RankRemove{Rank: rank(r), VNI: vni, Addr: addr(r), Keep: keep})
}

// stop stops a rank keeping its dir, naming neither its job network nor
// its address.
func (f *fixture) stop(n, r int) error {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).RankRemove(ctx, agentv1.RankRemove{Rank: rank(r), Keep: true})
}

func (f *fixture) kill(n, r, sig int) error {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).Kill(ctx, name(r), sig)
}

func (f *fixture) migrateOut(n, r, seq int) error {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).MigrateOut(ctx, agentv1.MigrateOut{Rank: rank(r), Seq: seq, VNI: vni, Addr: addr(r)})
}

// migrateIn brings rank r, prepared as seq on node from, to node to.
func (f *fixture) migrateIn(to, from, r, seq int, hold time.Duration) (agentv1.MigratedIn, error) {
	ctx, cancel := f.ctx()
	defer cancel()
	src := f.nodes[from]
	return f.agent(to).MigrateIn(ctx, agentv1.MigrateIn{Rank: rank(r), Seq: seq, From: src.Addr, FromNode: src.Name,
		Net: f.jobNet(to, nil), Addr: addr(r), Hold: hold})
}

func (f *fixture) fetch(to, from, r, seq int) (agentv1.Image, error) {
	ctx, cancel := f.ctx()
	defer cancel()
	src := f.nodes[from]
	return f.agent(to).Fetch(ctx, agentv1.Fetch{Container: name(r), Seq: seq, From: src.Addr, FromNode: src.Name})
}

func (f *fixture) setJobNet(n int, j agentv1.JobNet) error {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).JobNet(ctx, j)
}

func (f *fixture) dropJobNet(n int) error {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).DeleteJobNet(ctx, vni)
}

func (f *fixture) dropImages(n, r int) (agentv1.Dropped, error) {
	return f.dropImagesOf(n, r)
}

// dropImagesOf drops rank r's images of checkpoints seqs on node n (all
// of them if none is given).
func (f *fixture) dropImagesOf(n, r int, seqs ...int) (agentv1.Dropped, error) {
	ctx, cancel := f.ctx()
	defer cancel()
	return f.agent(n).DropImages(ctx, agentv1.DropImages{Containers: []string{name(r)}, Seqs: seqs})
}

// state is what a coordinator can see of a rank container on a node:
// its status (gone if the node has none) and whether its network is
// locked.
type state struct {
	Status agentv1.Status
	Locked bool
}

// The states the cases expect.
var (
	running = state{Status: agentv1.StatusRunning}
	frozen  = state{Status: agentv1.StatusPaused, Locked: true}
	exited  = state{Status: agentv1.StatusExited}
	// stopped: ended at a checkpoint (a commit with Stop), never thawed.
	stopped = state{Status: agentv1.StatusCheckpointed, Locked: true}
	gone    = state{}
)

func (s state) String() string {
	switch {
	case s.Status == "":
		return "gone"
	case s.Locked:
		return string(s.Status) + ", network locked"
	}
	return string(s.Status)
}

// state returns rank r's state on node n, and its container.
func (f *fixture) state(n, r int) (state, agentv1.Container) {
	f.t.Helper()
	// The lock first: a rank the agent removes meanwhile (at the end of a
	// hold) is then gone for Get.
	ctx, cancel := f.ctx()
	defer cancel()
	locked, lerr := f.nodes[n].Locked(ctx, name(r))
	ct, err := f.get(n, r)
	if isCode(err, agentv1.CodeNotFound) {
		return gone, ct
	}
	mustOK(f.t, err, "get %s on %s", name(r), f.nodes[n].Name)
	mustOK(f.t, lerr, "is the network of %s on %s locked", name(r), f.nodes[n].Name)
	if ct.Name != name(r) {
		f.t.Errorf("get %s answered container %s", name(r), ct.Name)
	}
	return state{Status: ct.Status, Locked: locked}, ct
}

// want checks rank r's state on node n now.
func (f *fixture) want(n, r int, want state) agentv1.Container {
	f.t.Helper()
	got, ct := f.state(n, r)
	if got != want {
		f.t.Fatalf("%s on %s is %s, want %s", name(r), f.nodes[n].Name, got, want)
	}
	return ct
}

// await waits, for at most within and Settle, until rank r on node n is
// in state want.
func (f *fixture) await(n, r int, want state, within time.Duration) agentv1.Container {
	f.t.Helper()
	deadline := time.Now().Add(within + f.env.Settle)
	for {
		got, ct := f.state(n, r)
		if got == want {
			return ct
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s on %s is still %s after %s, want %s", name(r), f.nodes[n].Name, got, within+f.env.Settle, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isCode(err error, code string) bool {
	var e *agentv1.Error
	return errors.As(err, &e) && e.Code == code
}

// mustOK ends the case if err is not nil.
func mustOK(t *testing.T, err error, format string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(format, args...), err)
	}
}

// wantOK fails the case if err is not nil.
func wantOK(t *testing.T, err error, format string, args ...any) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", fmt.Sprintf(format, args...), err)
	}
}

// wantCode fails the case unless err is the agent's answer with code.
func wantCode(t *testing.T, err error, code string, format string, args ...any) {
	t.Helper()
	if !isCode(err, code) {
		t.Errorf("%s: %v (%T), want the agent's %s", fmt.Sprintf(format, args...), err, err, code)
	}
}
