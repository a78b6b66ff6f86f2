package faults

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// ringMessages sizes the job so that it runs on through a case.
const ringMessages = 1_500_000

// agentCase is one protocol step at which a node's agent dies.
type agentCase struct {
	name  string
	point string // the agent's failpoint
	// victim is the node whose agent dies at the point, for the job
	// placed on place with a spare node free.
	victim func(c *testutil.Cluster, place []string, spare string) string
	// start starts the protocol and returns its outcome once it returns.
	start func(c *testutil.Cluster, place []string, spare string) <-chan error
	// after, if set, checks what the case promises besides the job's
	// settling and result, once it has settled.
	after func(t *testing.T, c *testutil.Cluster)
	// runOn: the job, once settled, runs on to its end, which must be
	// exact (rather than being killed and restarted from its newest
	// checkpoint): what the fault left in a running rank's memory counts.
	runOn bool
}

// run is cairn args as a protocol's outcome.
func run(c *testutil.Cluster, args ...string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		out, err := c.Run(args...)
		if err != nil {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(out))
		}
		ch <- err
	}()
	return ch
}

// successor is the node after node in the ring order of names: where a
// replica of its images goes first (coord replicaTargets).
func successor(c *testutil.Cluster, node string) string {
	names := slices.Sorted(slices.Values(c.Nodes))
	return names[(slices.Index(names, node)+1)%len(names)]
}

// protectedAgain: the checkpoint the case took, whose copy its victim was
// making, is protected again by itself: the copy made once the agent is
// back.
func protectedAgain(t *testing.T, c *testutil.Cluster) {
	t.Helper()
	ck := c.WaitProtected("ring", 2*time.Minute)
	t.Logf("checkpoint %d protected: %+v", ck.Seq, ck.Ranks)
}

// rotated is the restart case's placement: every rank one node on, the
// first on the spare.
func rotated(place []string, spare string) []string {
	return append([]string{spare}, place[:len(place)-1]...)
}

var agentCases = []agentCase{{
	name:   "commit",
	point:  "commit",
	victim: func(_ *testutil.Cluster, place []string, _ string) string { return place[1] },
	start: func(c *testutil.Cluster, _ []string, _ string) <-chan error {
		return run(c, "checkpoint", "ring")
	},
}, {
	name:   "restart-restored",
	point:  "restored",
	victim: func(_ *testutil.Cluster, place []string, spare string) string { return rotated(place, spare)[1] },
	start: func(c *testutil.Cluster, place []string, spare string) <-chan error {
		return run(c, "restart", "ring", "--placement", strings.Join(rotated(place, spare), ","))
	},
}, {
	// A checkpoint's copy: its receiver dies with every chunk stored and
	// the image not yet listed, then once listed and before it answers.
	name:   "replication-received",
	point:  "fetch-chunks",
	victim: func(c *testutil.Cluster, place []string, _ string) string { return successor(c, place[1]) }, // rank 1's copy
	start: func(c *testutil.Cluster, _ []string, _ string) <-chan error {
		return run(c, "checkpoint", "ring")
	},
	after: protectedAgain,
}, {
	name:   "replication-listed",
	point:  "fetched",
	victim: func(c *testutil.Cluster, place []string, _ string) string { return successor(c, place[1]) },
	start: func(c *testutil.Cluster, _ []string, _ string) <-chan error {
		return run(c, "checkpoint", "ring")
	},
	after: protectedAgain,
}, {
	// A restart's target dies as it fetches its rank's image, and as it
	// is told to resume its restored rank.
	name:   "restart-fetch",
	point:  "fetch-chunks",
	victim: func(_ *testutil.Cluster, place []string, spare string) string { return rotated(place, spare)[1] },
	start: func(c *testutil.Cluster, place []string, spare string) <-chan error {
		return run(c, "restart", "ring", "--placement", strings.Join(rotated(place, spare), ","))
	},
}, {
	name:   "restart-resume",
	point:  "resume",
	victim: func(_ *testutil.Cluster, place []string, spare string) string { return rotated(place, spare)[1] },
	start: func(c *testutil.Cluster, place []string, spare string) <-chan error {
		return run(c, "restart", "ring", "--placement", strings.Join(rotated(place, spare), ","))
	},
}, {
	// A lazy restart's target dies while its rank's pages still arrive.
	name:   "lazy-restart-pages",
	point:  "lazy-pages",
	victim: func(_ *testutil.Cluster, place []string, spare string) string { return rotated(place, spare)[1] },
	start: func(c *testutil.Cluster, place []string, spare string) <-chan error {
		return run(c, "restart", "ring", "--lazy", "--placement", strings.Join(rotated(place, spare), ","))
	},
	// A page that never arrived would read as zeros.
	runOn: true,
}, {
	name:   "migration-source-dumped",
	point:  "prepared",
	victim: func(_ *testutil.Cluster, place []string, _ string) string { return place[1] },
	start: func(c *testutil.Cluster, _ []string, spare string) <-chan error {
		return run(c, "migrate", "ring/1", "--to", spare)
	},
}}

// TestAgentDies: for each case, a ring job of 3 ranks with a replica of
// every image and a protected checkpoint, on 3 of 4 nodes; the agent of
// the case's node holds at the case's failpoint and is killed there,
// then started again. Whatever the protocol returned, the job settles
// running, every rank once on the nodes, and killed and restarted from
// its newest restorable checkpoint it ends with exactly the uninterrupted
// run's result.
func TestAgentDies(t *testing.T) {
	cases := agentCases
	if os.Getenv("CAIRN_FAULTS") == "" {
		cases = cases[:1] // make faults runs them all
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := testutil.NewCluster(t, 4)
			c.OK("run", "--job", "ring", "--ranks", "3", "--per-node", "1", "--nodes", strings.Join(c.Nodes[:3], ","), "--replicas", "1",
				"--", c.Bin, "ringapp", "-messages", fmt.Sprint(ringMessages))
			c.WaitProgress("ring", 3, 0, 90*time.Second)
			c.OK("checkpoint", "ring")
			c.WaitProtected("ring", 2*time.Minute)
			place := c.Status("ring").Placement
			spare := c.Unused(place)

			// The victim's agent is started again with the point armed:
			// it holds there when the protocol reaches it.
			victim := tc.victim(c, place, spare)
			c.RestartAgent(victim, failpoint.Env+"="+tc.point)
			done := tc.start(c, place, spare)
			c.WaitAgentLog(victim, "failpoint="+tc.point, 2*time.Minute)
			restart := c.KillAgent(victim)
			restart()
			select {
			case err := <-done:
				t.Logf("%s: the agent of %s killed at %s; the protocol returned %v", tc.name, victim, tc.point, err)
			case <-time.After(3 * time.Minute):
				t.Fatalf("%s: the protocol did not return within 3 min of the agent's death", tc.name)
			}
			settled(t, c, "ring", 3)
			if tc.after != nil {
				tc.after(t, c)
			}
			want := ringapp.Expected(3, ringMessages, 64, 1)
			if tc.runOn {
				if got := c.Result("ring"); got != want {
					t.Fatalf("result %s of the job run on after the agent died at %s, want %s", got, tc.point, want)
				}
				return
			}
			ck := newestRestorable(t, c, "ring")
			c.OK("kill", "ring")
			c.OK("restart", "ring", "--from", fmt.Sprint(ck))
			if got := c.Result("ring"); got != want {
				t.Fatalf("result %s after the agent died at %s, want %s", got, tc.point, want)
			}
			c.CheckRestarted("ring", ck, testutil.RingOutput)
		})
	}
}

// settled waits until job runs, nothing starting, restarting or
// migrating it, and every one of its ranks runs exactly once, on the
// node its record places it on.
func settled(t *testing.T, c *testutil.Cluster, job string, ranks int) {
	t.Helper()
	testutil.WaitUntil(t, 3*time.Minute, func() (bool, string) {
		j := c.Job(job)
		if j.State != "running" {
			return false, fmt.Sprintf("job %s is %s (%s)", job, j.State, j.Reason)
		}
		running := map[string][]string{}
		for _, n := range c.Nodes {
			for name, st := range c.NodeContainers(n) {
				if st == "running" && strings.HasPrefix(name, job+".") {
					running[name] = append(running[name], n)
				}
			}
		}
		for r := range ranks {
			name := fmt.Sprintf("%s.%d", job, r)
			if on := running[name]; len(on) != 1 || on[0] != j.Placement[r] {
				return false, fmt.Sprintf("rank %d runs on %v, placed on %s", r, on, j.Placement[r])
			}
		}
		return true, ""
	})
}

// newestRestorable is the number of the job's newest checkpoint a restart
// may use.
func newestRestorable(t *testing.T, c *testutil.Cluster, job string) int {
	t.Helper()
	cks := c.Ckpts(job)
	for i := len(cks) - 1; i >= 0; i-- {
		if cks[i].Restorable() {
			return cks[i].Seq
		}
	}
	t.Fatalf("job %s has no restorable checkpoint: %+v", job, cks)
	return 0
}
