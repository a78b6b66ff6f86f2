package restore

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestRestartFromHolders: a node holding a rank dies during a job with
// k=2, and the job is restarted with that rank on a node without a copy
// of its image (an automatic restart would put it where a copy is, and
// fetch nothing), so the rank is restored from the stream of its image's
// chunks from the two surviving holders at once, written to staging as
// they arrive (the agent's log shows both sent part of it). One holder
// hangs at its second share of any image's chunks and is killed there, in
// the middle of the restart: the other holder sends what it had left, the
// job finishes with exactly the uninterrupted run's result, every rank's
// 16 MiB of ballast memory checked unchanged, and the node's store takes
// its copy of the image afterwards.
func TestRestartFromHolders(t *testing.T) {
	const messages = 1_500_000
	c := testutil.NewCluster(t, 6)
	sc := newHolderScenario(t, c, 4, messages, 16)
	place, next, victim, survivor := sc.place, sc.next, sc.victim, sc.survivor
	c.RestartAgent(victim, "CAIRN_FAILPOINT=chunk-data")
	c.OK("kill", "ring")
	c.KillNodes([]string{place[1]}, true)
	c.WaitNodes(5, time.Minute)
	// Fetches that repair the lost copies may reach the failpoint first.
	time.Sleep(2 * time.Second)
	hung := func() int { return strings.Count(c.AgentLog(victim), "failpoint=chunk-data") }
	before := hung()
	done := make(chan error, 1)
	go func() {
		out, err := c.Run("restart", "ring", "--placement", strings.Join(next, ","))
		if err != nil {
			err = fmt.Errorf("%w: %s", err, out)
		}
		done <- err
	}()
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		return hung() > before, "the restart's fetch never reached the victim's failpoint"
	})
	c.KillNodes([]string{victim}, true)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("cairn restart: %v", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("cairn restart did not return")
	}
	if p := c.Status("ring").Placement; !slices.Equal(p, next) {
		t.Fatalf("restarted on %v, want %v", p, next)
	}
	if got, want := c.Result("ring"), ringapp.Expected(4, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	c.CheckRestarted("ring", 1, testutil.RingOutput)

	// Rank 1's new node read the image from both holders at once: the
	// victim sent its first share before it hung at its second, the
	// survivor the rest. The image may have come by the restart's own
	// stream, or by the repair of the lost copy that happened to target
	// the same node first (then the restart restored from the store).
	alog := c.AgentLog(next[1])
	streamed := regexp.MustCompile(`msg="restored from the stream" ckpt=ring\.1:\d+ peer=(\S+)`).FindStringSubmatch(alog)
	fetches := regexp.MustCompile(`msg="?replicated"? job=ring ckpt=\d+ rank=1 node=`+regexp.QuoteMeta(next[1])+` peer=(\S+)`).FindAllStringSubmatch(c.CoordinatorLog(), -1)
	both := func(peers string) bool {
		from := strings.Split(peers, ",")
		return slices.Contains(from, victim) && slices.Contains(from, survivor)
	}
	switch {
	case streamed != nil:
		t.Logf("rank 1 restored on %s from the stream of %s", next[1], streamed[1])
		if !both(streamed[1]) {
			t.Errorf("rank 1 was restored on %s from the stream of %s, want both %s and %s", next[1], streamed[1], victim, survivor)
		}
		if !regexp.MustCompile(`restore from the stream: holder given up; its pages come from the others" ckpt=ring\.1:\d+ peer=` + regexp.QuoteMeta(victim)).MatchString(alog) {
			t.Errorf("%s's agent log does not show %s given up mid-stream:\n%s", next[1], victim, alog)
		}
		// Its store takes the copy afterwards, from the survivor.
		testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
			return regexp.MustCompile(`msg="fetched for restart" job=ring ckpt=\d+ rank=1 node=` + regexp.QuoteMeta(next[1])).MatchString(c.CoordinatorLog()),
				"the node that restored rank 1 from the stream never stored its copy"
		})
	case len(fetches) > 0:
		t.Logf("rank 1's image copied to %s before the restart: %q", next[1], fetches)
		if !slices.ContainsFunc(fetches, func(m []string) bool { return both(m[1]) }) {
			t.Errorf("no copy of rank 1 onto %s from both %s and %s: %q", next[1], victim, survivor, fetches)
		}
		if !regexp.MustCompile(`fetch: holder given up; its share goes to the others" ckpt=ring\.1:\d+ peer=` + regexp.QuoteMeta(victim)).MatchString(alog) {
			t.Errorf("%s's agent log does not show %s given up mid-fetch:\n%s", next[1], victim, alog)
		}
	default:
		t.Errorf("rank 1 came to %s neither by the stream nor by a copy:\n%s", next[1], alog)
	}
}

// holderScenario is a ring job with k=2, its checkpoint protected, and
// where its ranks go for a restart from rank 1's holders: rank 1 to a
// node with no copy of its image, and a rank on the victim (one of the
// holders, which dies during the restart) to another such node; the
// others stay.
type holderScenario struct {
	place, next      []string
	victim, survivor string // rank 1's two copies besides its node
}

func newHolderScenario(t *testing.T, c *testutil.Cluster, ranks, messages, ballastMiB int) holderScenario {
	t.Helper()
	c.OK("run", "--job", "ring", "--ranks", fmt.Sprint(ranks), "--per-node", "1", "--replicas", "2", "--on-failure", "stop", "--",
		c.Bin, "ringapp", "-messages", fmt.Sprint(messages), "-ballast", fmt.Sprint(ballastMiB))
	place := c.Status("ring").Placement
	c.WaitProgress("ring", ranks, 0, 90*time.Second)
	c.OK("checkpoint", "ring")
	ck := c.WaitProtected("ring", 90*time.Second)
	copies := func(r int) []string { return ck.Ranks[r].Copies }
	var holders []string // rank 1's copies but the one on its node
	for _, n := range copies(1) {
		if n != place[1] {
			holders = append(holders, n)
		}
	}
	if len(holders) != 2 {
		t.Fatalf("rank 1's copies %v besides its node %s: want two", copies(1), place[1])
	}
	victim := holders[0]
	used := map[string]bool{place[1]: true, victim: true}
	for r, n := range place {
		if r != 1 && n != victim {
			used[n] = true
		}
	}
	free := func(r int) string {
		for _, n := range c.Nodes {
			if !used[n] && !slices.Contains(copies(r), n) {
				used[n] = true
				return n
			}
		}
		t.Fatalf("no node for rank %d without a copy (placement %v, copies %v)", r, place, copies(r))
		return ""
	}
	next := slices.Clone(place)
	next[1] = free(1)
	for r, n := range place {
		if n == victim {
			next[r] = free(r)
		}
	}
	return holderScenario{place: place, next: next, victim: victim, survivor: holders[1]}
}
