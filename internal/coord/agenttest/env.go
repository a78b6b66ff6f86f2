package agenttest

import (
	"context"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// Agent is what the coordinator asks of a node's agent: coord.Agent, whose
// method set it repeats so that this package links nothing of the
// coordinator (the suite's own tests check that the two stay the same).
type Agent interface {
	JobNet(ctx context.Context, req agentv1.JobNet) error
	DeleteJobNet(ctx context.Context, vni uint32) error
	RankRun(ctx context.Context, req agentv1.RankRun) (agentv1.Container, error)
	RankRestore(ctx context.Context, req agentv1.RankRestore) (agentv1.Container, error)
	RankResume(ctx context.Context, req agentv1.RankResume) error
	RankRemove(ctx context.Context, req agentv1.RankRemove) error
	RankStall(ctx context.Context, req agentv1.RankStall) error
	Prepare(ctx context.Context, req agentv1.Prepare) (agentv1.Prepared, error)
	Commit(ctx context.Context, req agentv1.Finish) (agentv1.Committed, error)
	Abort(ctx context.Context, req agentv1.Finish) error
	Fetch(ctx context.Context, req agentv1.Fetch) (agentv1.Image, error)
	MigrateIn(ctx context.Context, req agentv1.MigrateIn) (agentv1.MigratedIn, error)
	MigrateOut(ctx context.Context, req agentv1.MigrateOut) error
	DropImages(ctx context.Context, req agentv1.DropImages) (agentv1.Dropped, error)
	TierFlush(ctx context.Context, req agentv1.TierFlush) (agentv1.TierFlushed, error)
	TierFetch(ctx context.Context, req agentv1.TierFetch) (agentv1.Image, error)
	TierRecord(ctx context.Context, req agentv1.TierRecord) error
	TierRead(ctx context.Context, req agentv1.TierRead) (agentv1.TierRecord, error)
	TierPrune(ctx context.Context, req agentv1.TierPrune) (agentv1.TierPruned, error)
	Kill(ctx context.Context, name string, sig int) error
	Get(ctx context.Context, name string) (agentv1.Container, error)
	Close()
}

// Node is one node of an Env: its agent as the coordinator calls it, and
// what the suite must know of the node besides.
type Node struct {
	// Name is the node's name, as other agents know it (a Fetch's or a
	// MigrateIn's FromNode).
	Name string
	// Addr is the address other agents reach its agent at (From).
	Addr string
	// Underlay is the node's underlay address: where job networks send
	// the traffic of the ranks on it (agentv1.JobNet's Remotes).
	Underlay string
	// Agent is the coordinator's client of the node's agent.
	Agent Agent
	// Locked reports whether the network of rank container name, on this
	// node, is locked (it sends and receives nothing); a network that is
	// gone is not. The agent API does not tell: the suite looks at the
	// node. It may fail for a container the node does not have.
	Locked func(ctx context.Context, name string) (bool, error)
}

// Env is an implementation of the agent under test.
type Env struct {
	// Nodes returns two fresh nodes, holding nothing, for one case. They
	// are the case's own: whatever is left on them when t ends goes with
	// them.
	Nodes func(t *testing.T) []Node
	// Args is what a rank runs (agentv1.RankRun's Args), from the root
	// RootFS (the node's "/" if ""): a process that runs until it is
	// killed.
	Args   []string
	RootFS string
	// Hold is the hold of the calls whose end the suite waits for: long
	// enough for a call and a look at the rank. Every other call holds
	// for longer than a case takes.
	Hold time.Duration
	// PendingTTL is how long, after its hold ended, the agent keeps the
	// image of a prepare nobody decided (agent.PendingTTL, or
	// memagent.Options.PendingTTL): the suite waits it out once.
	PendingTTL time.Duration
	// Settle bounds how long the agent may take to do by itself what the
	// suite waits for, once it is due: a killed rank ending, a hold's end
	// carried out.
	Settle time.Duration
	// Parallel runs the cases side by side.
	Parallel bool
	// Tier returns the URL of a durable tier both nodes of a case reach,
	// empty, for that case alone.
	Tier func(t *testing.T) string
}
