package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// finalRE is a rank's last line in examples/rank-api/ckpt.py.
var finalRE = regexp.MustCompile(`rank (\d+): FINAL steps=\d+ checksum=([0-9a-f]+)`)

// TestAgentDiesRankAPI: rank 0 of a job of examples/rank-api/ckpt.py (the
// Python client) asks its agent for a checkpoint of its job; the agent
// holds the request at a failpoint (rank-request: read, not carried out;
// rank-reply: carried out, its reply not written), is killed there and
// started again. The client, whose connection closed, sends the request
// again to the new agent: the rank's call must return a checkpoint of the
// job (not hang, not fail), which is restorable, and every rank end with
// exactly what it computes alone. An agent started again has forgotten
// the ids of the requests it answered (docs/rank-api.md): a request it
// had carried out makes another round, so rank-reply may leave two
// checkpoints; rank-request exactly one.
func TestAgentDiesRankAPI(t *testing.T) {
	points := []string{"rank-request", "rank-reply"}
	if os.Getenv("CAIRN_FAULTS") == "" {
		t.Skip("part of the fault matrix: CAIRN_FAULTS=1 (make faults)")
	}
	prog, err := filepath.Abs("../../examples/rank-api/ckpt.py")
	if err != nil {
		t.Fatal(err)
	}
	const steps, at = 900, 300
	args := []string{"--steps", fmt.Sprint(steps), "--checkpoint-at", fmt.Sprint(at), "--every", "100"}
	want := map[int]string{}
	for r := range 3 {
		out, err := exec.Command("/usr/bin/python3", append([]string{prog, "--rank", strconv.Itoa(r), "--sleep-ms", "0"}, args...)...).CombinedOutput()
		m := finalRE.FindStringSubmatch(string(out))
		if err != nil || m == nil {
			t.Fatalf("ckpt.py alone as rank %d: %v\n%s", r, err, out)
		}
		want[r] = m[2]
	}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			c := testutil.NewCluster(t, 3)
			// Every node's agent holds at the point: only the asker's,
			// rank 0's, reaches it.
			for _, n := range c.Nodes {
				c.RestartAgent(n, failpoint.Env+"="+point)
			}
			run := []string{"run", "--job", "ask", "--ranks", "3", "--per-node", "1", "--env", "PYTHONPATH=/opt/cairn/python", "--", "/usr/bin/python3", prog}
			c.OK(append(run, append(args, "--sleep-ms", "20")...)...)
			victim := c.Status("ask").Placement[0]
			c.WaitAgentLog(victim, "failpoint="+point, 2*time.Minute)
			c.KillAgent(victim)()

			asked := regexp.MustCompile(`rank 0: (checkpoint (\d+) done|no checkpoint) at step ` + fmt.Sprint(at) + `[^\n]*`)
			var m []string
			testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
				m = asked.FindStringSubmatch(c.Logs("ask", 0))
				return m != nil, "rank 0's checkpoint call has not returned:\n" + c.Logs("ask", 0)
			})
			if m[2] == "" {
				t.Fatalf("rank 0's checkpoint call, sent again to the agent started again: %q", m[0])
			}
			seq, _ := strconv.Atoi(m[2])
			var restorable []int
			for _, ck := range c.Ckpts("ask") {
				if ck.Restorable() {
					restorable = append(restorable, ck.Seq)
				}
			}
			t.Logf("%s: rank 0's call returned checkpoint %d; restorable checkpoints %v", point, seq, restorable)
			if !slices.Contains(restorable, seq) || len(restorable) < 1 || len(restorable) > 2 || (point == "rank-request" && len(restorable) != 1) {
				t.Errorf("checkpoint %d returned to rank 0, restorable %v: want it among them, and one round (two at most once carried out)", seq, restorable)
			}
			for r := range 3 {
				var got []string
				testutil.WaitUntil(t, 3*time.Minute, func() (bool, string) {
					got = finalRE.FindStringSubmatch(c.Logs("ask", r))
					return got != nil, fmt.Sprintf("rank %d has not ended:\n%s", r, c.Logs("ask", r))
				})
				if got[2] != want[r] {
					t.Errorf("rank %d ended with %s, want %s (what it computes alone)", r, got[2], want[r])
				}
				if n := strings.Count(c.Logs("ask", r), fmt.Sprintf("rank %d of 3, job ask", r)); n != 1 {
					t.Errorf("rank %d started %d times", r, n)
				}
			}
		})
	}
}
