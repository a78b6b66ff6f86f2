package faults

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"cairn/internal/failpoint"
	"cairn/internal/ringapp"
	"cairn/internal/testutil"
)

// ringMessages sizes the job so that it runs on through a case.
const ringMessages = 1_500_000

// agentCase is one protocol step at which a node's agent dies.
type agentCase struct {
	name  string
	point string // the agent's failpoint
	// victim is the node whose agent dies at the point, for the job
	// placed on place with a spare node free.
	victim func(place []string, spare string) string
	// start starts the protocol and returns its outcome once it returns.
	start func(c *testutil.Cluster, place []string, spare string) <-chan error
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

// rotated is the restart case's placement: every rank one node on, the
// first on the spare.
func rotated(place []string, spare string) []string {
	return append([]string{spare}, place[:len(place)-1]...)
}

var agentCases = []agentCase{{
	name:   "commit",
	point:  "commit",
	victim: func(place []string, _ string) string { return place[1] },
	start: func(c *testutil.Cluster, _ []string, _ string) <-chan error {
		return run(c, "checkpoint", "ring")
	},
}, {
	name:   "restart-restored",
	point:  "restored",
	victim: func(place []string, spare string) string { return rotated(place, spare)[1] },
	start: func(c *testutil.Cluster, place []string, spare string) <-chan error {
		return run(c, "restart", "ring", "--placement", strings.Join(rotated(place, spare), ","))
	},
}, {
	name:   "migration-source-dumped",
	point:  "prepared",
	victim: func(place []string, _ string) string { return place[1] },
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
			victim := tc.victim(place, spare)
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
			ck := newestRestorable(t, c, "ring")
			c.OK("kill", "ring")
			c.OK("restart", "ring", "--from", fmt.Sprint(ck))
			if got, want := c.Result("ring"), ringapp.Expected(3, ringMessages, 64, 1); got != want {
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
