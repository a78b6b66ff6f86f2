package memagent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/coord/agenttest"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// pendingTTL is the agents' memagent.Options.PendingTTL.
const pendingTTL = 300 * time.Millisecond

// env is the agent conformance suite's Env of in-memory agents, each
// node's agent wrapped by wrap if it is set.
func env(wrap func(agenttest.Agent) agenttest.Agent) agenttest.Env {
	return agenttest.Env{
		Nodes: func(t *testing.T) []agenttest.Node {
			c := memagent.New(memagent.Options{Seed: 1, PendingTTL: pendingTTL})
			var out []agenttest.Node
			for _, name := range []string{"n1", "n2"} {
				n := c.AddNode(name)
				var a agenttest.Agent = c.Client("coord", name)
				if wrap != nil {
					a = wrap(a)
				}
				out = append(out, agenttest.Node{Name: name, Addr: n.Addr(), Underlay: n.Underlay(), Agent: a,
					Locked: func(_ context.Context, ct string) (bool, error) {
						c, ok := n.Container(ct)
						if !ok {
							return false, fmt.Errorf("no container %s on %s", ct, name)
						}
						return c.Locked, nil
					}})
			}
			return out
		},
		Tier:       func(t *testing.T) string { return "mem://" + t.Name() },
		Args:       []string{"/bin/true"},
		Hold:       200 * time.Millisecond,
		PendingTTL: pendingTTL,
		Settle:     2 * time.Second,
		Parallel:   true,
	}
}

// TestConformance: the in-memory agents keep the agent's contract, as the
// real agent does (test/conform runs the same suite against it).
func TestConformance(t *testing.T) { agenttest.Run(t, env(nil)) }

// divergences are in-memory agents with one behaviour changed from the
// real agent's, and the cases of the suite that must fail for it.
var divergences = map[string]struct {
	wrap  func(agenttest.Agent) agenttest.Agent
	fails []string
}{
	// A commit sent again is refused rather than answered from the store.
	"commit-once": {func(a agenttest.Agent) agenttest.Agent { return &commitOnce{Agent: a} }, []string{"PrepareCommit", "PrepareCommitStop"}},
	// A commit with Stop thaws its rank as any other commit does (the
	// job runs on past the checkpoint it was stopped at).
	"stop-ignored": {func(a agenttest.Agent) agenttest.Agent { return stopIgnored{a} }, []string{"PrepareCommitStop"}},
	// No hold ever ends: stalled, prepared and moved-in ranks wait for
	// the coordinator for good.
	"endless-holds": {func(a agenttest.Agent) agenttest.Agent { return endlessHolds{a} },
		[]string{"MigrateInHoldEnds", "PrepareHoldEnds", "PreparedImageExpires", "StallHoldEnds"}},
	// The refusal of a job network is no answer (what the in-memory
	// agents did before the suite).
	"jobnet-unanswered": {func(a agenttest.Agent) agenttest.Agent { return jobNetUnanswered{a} }, []string{"JobNet"}},
}

// divergenceEnv names the divergence TestDivergent runs the suite
// against, in the child process TestConformanceCatchesDivergences starts.
const divergenceEnv = "CAIRN_AGENTTEST_DIVERGENCE"

// TestDivergent runs the suite against the in-memory agents with the
// divergence named by $CAIRN_AGENTTEST_DIVERGENCE; it is expected to
// fail, so it runs only as TestConformanceCatchesDivergences's child.
func TestDivergent(t *testing.T) {
	name := os.Getenv(divergenceEnv)
	if name == "" {
		t.Skip("run by TestConformanceCatchesDivergences, with $" + divergenceEnv)
	}
	d, ok := divergences[name]
	if !ok {
		t.Fatalf("no divergence %q", name)
	}
	agenttest.Run(t, env(d.wrap))
}

// TestConformanceCatchesDivergences: the suite fails against in-memory
// agents that differ from the real agent in one behaviour, in exactly the
// cases that cover it, and passes the others.
func TestConformanceCatchesDivergences(t *testing.T) {
	result := regexp.MustCompile(`(?m)^\s*--- (PASS|FAIL): TestDivergent/(\w+) `)
	for name, d := range divergences {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestDivergent$", "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), divergenceEnv+"="+name)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("the suite against %s: %v, want it to fail\n%s", name, err, out)
			}
			var failed, passed []string
			for _, m := range result.FindAllStringSubmatch(string(out), -1) {
				if m[1] == "FAIL" {
					failed = append(failed, m[2])
				} else {
					passed = append(passed, m[2])
				}
			}
			slices.Sort(failed)
			if !slices.Equal(failed, d.fails) {
				t.Errorf("the suite against %s failed %v, want %v\n%s", name, failed, d.fails, out)
			}
			if got, want := len(failed)+len(passed), len(agenttest.Names()); got != want {
				t.Errorf("the suite against %s ran %d cases, want %d\n%s", name, got, want, out)
			}
			if strings.Contains(string(out), "panic:") {
				t.Errorf("the suite against %s panicked\n%s", name, out)
			}
		})
	}
}

// commitOnce refuses a commit it has carried out before.
type commitOnce struct {
	agenttest.Agent
	mu   sync.Mutex
	done map[agentv1.Finish]bool
}

func (a *commitOnce) Commit(ctx context.Context, req agentv1.Finish) (agentv1.Committed, error) {
	a.mu.Lock()
	again := a.done[req]
	a.mu.Unlock()
	if again {
		return agentv1.Committed{}, &agentv1.Error{Code: agentv1.CodeNoSuchRound, Message: "committed already"}
	}
	out, err := a.Agent.Commit(ctx, req)
	if err == nil {
		a.mu.Lock()
		if a.done == nil {
			a.done = map[agentv1.Finish]bool{}
		}
		a.done[req] = true
		a.mu.Unlock()
	}
	return out, err
}

// stopIgnored drops a commit's Stop.
type stopIgnored struct{ agenttest.Agent }

func (a stopIgnored) Commit(ctx context.Context, req agentv1.Finish) (agentv1.Committed, error) {
	req.Stop = false
	return a.Agent.Commit(ctx, req)
}

// endlessHolds asks for holds a thousand times longer than the caller's.
type endlessHolds struct{ agenttest.Agent }

const forever = 1000

func (a endlessHolds) RankStall(ctx context.Context, req agentv1.RankStall) error {
	req.Hold *= forever
	return a.Agent.RankStall(ctx, req)
}

func (a endlessHolds) Prepare(ctx context.Context, req agentv1.Prepare) (agentv1.Prepared, error) {
	req.Hold *= forever
	return a.Agent.Prepare(ctx, req)
}

func (a endlessHolds) MigrateIn(ctx context.Context, req agentv1.MigrateIn) (agentv1.MigratedIn, error) {
	req.Hold *= forever
	return a.Agent.MigrateIn(ctx, req)
}

// jobNetUnanswered turns the agent's refusal of a job network into an
// error that is no answer.
type jobNetUnanswered struct{ agenttest.Agent }

func (a jobNetUnanswered) JobNet(ctx context.Context, req agentv1.JobNet) error {
	err := a.Agent.JobNet(ctx, req)
	var e *agentv1.Error
	if errors.As(err, &e) {
		return errors.New(e.Message)
	}
	return err
}
