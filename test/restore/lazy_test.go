package restore

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestLazyRestartHolderDies: a node holding a rank dies during a job with
// k=2; the job is restarted lazily with that rank on a node without a copy
// of its image, so the rank runs while its 192 MiB of ballast memory is
// still arriving from the two surviving holders. Once the job runs again,
// one holder hangs at its next request, in the middle of the background
// prefetch, and is killed there: the other holder serves what it had
// left, and the job finishes with exactly the uninterrupted run's result,
// every rank's ballast checked unchanged.
func TestLazyRestartHolderDies(t *testing.T) {
	const messages = 1_500_000
	c := testutil.NewCluster(t, 5)
	sc := newHolderScenario(t, c, 2, messages, 192)
	place, next, victim := sc.place, sc.next, sc.victim
	armed := filepath.Join(t.TempDir(), "armed")
	c.RestartAgent(victim, failpoint.Env+"=chunk-data", failpoint.ArmedEnv+"="+armed)
	c.OK("kill", "ring")
	c.KillNodes([]string{place[1]}, true)
	c.WaitNodes(4, time.Minute)
	hung := func() int { return strings.Count(c.AgentLog(victim), "failpoint=chunk-data") }
	before := hung()
	c.OK("restart", "ring", "--lazy", "--placement", strings.Join(next, ","))
	if err := os.WriteFile(armed, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
		return hung() > before, "the lazy restore's prefetch never reached the victim's failpoint"
	})
	if strings.Contains(c.AgentLog(next[1]), "lazy restore: every page is here") {
		t.Fatal("the lazy restore had completed before the victim hung")
	}
	c.KillNodes([]string{victim}, true)
	if got, want := c.Result("ring"), ringapp.Expected(2, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	c.CheckRestarted("ring", 1, testutil.RingOutput)

	// Rank 1's node served its pages lazily, all of the 192 MiB ballast
	// among them, and gave the victim up on the way.
	log := c.AgentLog(next[1])
	m := regexp.MustCompile(`msg="lazy restore: every page is here" ckpt=ring\.1:\d+ pages=(\d+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("%s's agent log shows no complete lazy restore of rank 1:\n%s", next[1], log)
	}
	if pages, _ := strconv.Atoi(m[1]); pages < 192<<20/4096 {
		t.Errorf("rank 1's page server served %s pages, want at least its ballast's %d", m[1], 192<<20/4096)
	}
	if !regexp.MustCompile(`lazy restore: holder given up; its pages come from the others" ckpt=ring\.1:\d+ peer=` + regexp.QuoteMeta(victim)).MatchString(log) {
		t.Errorf("%s's agent log does not show %s given up mid-restore:\n%s", next[1], victim, log)
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "lazy") {
			t.Log(line)
		}
	}
}
