package ops

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestJobEnds: jobs whose ranks all exit 0, one of whose ranks exits 7,
// and one with --kill-on-bad-exit whose rank 0 exits 3 while rank 1 would
// run on, each end in their state (exited, failed, failed with rank 1
// killed) with their event, in `cairn jobs --json` and in
// cairn_job_state. They used to stay running.
func TestJobEnds(t *testing.T) {
	c := testutil.NewCluster(t, 2)
	run := func(job, script string, extra ...string) {
		t.Helper()
		c.OK(append(append([]string{"run", "--job", job, "--ranks", "2", "--per-node", "1"}, extra...), "--", "sh", "-c", script)...)
	}
	run("ok", "sleep 1; exit 0")
	run("bad", `sleep 1; [ "$CAIRN_RANK" = 1 ] && exit 7; exit 0`)
	run("strict", `if [ "$CAIRN_RANK" = 0 ]; then sleep 1; exit 3; fi; exec sleep 1000`, "--kill-on-bad-exit")

	want := map[string]struct{ state, reason, event string }{
		"ok":     {"exited", "every rank exited 0", evv1.JobExited},
		"bad":    {"failed", "rank 1 exited 7", evv1.JobFailed},
		"strict": {"failed", "rank 0 exited 3; the other 1 ranks killed (--kill-on-bad-exit)", evv1.JobFailed},
	}
	for job, w := range want {
		testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
			j := c.Job(job)
			return j.State == w.state, fmt.Sprintf("%s is %s (%s), want %s", job, j.State, j.Reason, w.state)
		})
		if j := c.Job(job); j.State == "failed" && j.Reason != w.reason {
			t.Errorf("%s failed for %q, want %q", job, j.Reason, w.reason)
		}
		var got []string
		for _, e := range c.Events("--job", job, "--type", "job.*") {
			got = append(got, e.Type)
			if e.Type == w.event && e.Message != w.reason {
				t.Errorf("%s's %s says %q, want %q", job, e.Type, e.Message, w.reason)
			}
		}
		if !strings.Contains(strings.Join(got, " "), w.event) {
			t.Errorf("%s's events %v lack %s", job, got, w.event)
		}
	}
	if st := c.Status("strict"); st.RankStates[1].ExitCode == nil || *st.RankStates[1].ExitCode != 137 {
		t.Errorf("strict's rank 1 after rank 0's bad exit: %+v, want killed", st.RankStates[1])
	}

	client := scraper(t, filepath.Join(c.Data, "cluster", "client"), true)
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		m := scrapeOK(t, client, c.File().Coordinator)
		for job, w := range want {
			for _, s := range []string{"running", w.state} {
				key := fmt.Sprintf(`cairn_job_state{job_name=%q,state=%q}`, job, s)
				if v := m[key]; v != map[bool]float64{true: 1, false: 0}[s == w.state] {
					return false, fmt.Sprintf("%s = %v", key, v)
				}
			}
		}
		return true, ""
	})
}
