package migrate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// checkPhases checks that the events of migration seq are its phases, in
// order.
func checkPhases(t *testing.T, evs []evv1.Event, seq int, want []string) {
	t.Helper()
	var got []string
	for _, e := range evs {
		if strings.HasPrefix(e.Type, "migration.") && e.Ckpt == seq {
			got = append(got, e.Type)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events of migration %d: %v, want %v", seq, got, want)
	}
}

// ringWithFreeNode runs a 3-rank ring on 3 of 4 nodes, one rank each, and
// waits until it moves: the cluster, the ranks' nodes and the free node.
func ringWithFreeNode(t *testing.T, messages int) (c *testutil.Cluster, place []string, free string) {
	t.Helper()
	c = testutil.NewCluster(t, 4)
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "3", "--per-node", "1"}, c.RingArgs(messages)...)...)
	place = c.Status("ring").Placement
	free = c.Unused(place)
	c.WaitProgress("ring", 3, 0, 60*time.Second)
	return c, place, free
}

// TestMigrateRank: a rank of the running ring moves twice, to two other
// nodes, while the ring passes checksummed messages at full speed. The
// job finishes with the result of an uninterrupted run (the ring fails on
// any lost, duplicated or reordered message), the moved rank went on from
// its image each time, the other ranks were never restarted (same
// processes), the moved rank's log keeps what it printed, and the events
// show every phase in order.
func TestMigrateRank(t *testing.T) {
	const messages = 1_500_000
	c, place, free := ringWithFreeNode(t, messages)
	pids := map[int]int{}
	for _, r := range c.Status("ring").RankStates {
		pids[r.Rank] = r.Pid
	}

	printed := c.Logs("ring", 1)

	first := c.Migrate("ring/1", "--to", free)
	if first.State != "done" || first.From != place[1] || first.To != free {
		t.Fatalf("first migration: %+v", first)
	}
	c.CheckRestored("ring", 1, first.Seq, testutil.RingOutput)
	before := c.Progress("ring", 0)
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		return c.Progress("ring", 0) > before, "the ring made no progress after the migration"
	})
	// Back to where it came from: a different node than the first move's.
	second := c.Migrate("ring/1", "--to", place[0])
	if second.State != "done" || second.To != place[0] {
		t.Fatalf("second migration: %+v", second)
	}
	after := c.Status("ring")
	if got := after.Placement[1]; got != place[0] {
		t.Fatalf("rank 1 on %s after two moves, want %s", got, place[0])
	}
	c.CheckRestored("ring", 1, second.Seq, testutil.RingOutput)
	// Its output moved with it: what it printed before the first move is
	// still the start of its log.
	if now := c.Logs("ring", 1); !strings.HasPrefix(now, printed) {
		t.Errorf("rank 1's log after two moves does not start with the %d bytes it printed before them:\n%s", len(printed), now[:min(len(now), 400)])
	}
	// And so did when each line came.
	for _, l := range strings.Split(strings.TrimSuffix(c.OK("logs", "-t", "ring/1"), "\n"), "\n") {
		if stamp, _, _ := strings.Cut(l, " "); stamp == "-" {
			t.Fatalf("a line of rank 1 has no time after two moves: %q", l)
		}
	}
	for _, r := range after.RankStates {
		if r.Rank != 1 && r.Pid != pids[r.Rank] {
			t.Errorf("rank %d was restarted: pid %d, was %d", r.Rank, r.Pid, pids[r.Rank])
		}
	}
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	evs := c.Events("--job", "ring")
	checkPhases(t, evs, first.Seq, testutil.MigrationPhases)
	checkPhases(t, evs, second.Seq, testutil.MigrationPhases)
	out := c.OK("migrations", "ring")
	if strings.Count(out, " done ") != 2 {
		t.Errorf("cairn migrations lists:\n%s", out)
	}
}

// killCRIUDump SIGKILLs the CRIU that runc runs (swrk) for the node whose
// data dir is data once CRIU's log in the node's staging dir says its
// parasite is in the rank (the rank's memory is being dumped), and
// returns its pid; 0 if no dump got that far within the time given.
func killCRIUDump(data, staging string, within time.Duration) int {
	deadline := time.Now().Add(within)
	cmdline := func(pid string) string {
		b, _ := os.ReadFile("/proc/" + pid + "/cmdline")
		return strings.ReplaceAll(string(b), "\x00", " ")
	}
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid := e.Name()
			if comm, _ := os.ReadFile("/proc/" + pid + "/comm"); string(comm) != "criu\n" || !strings.Contains(cmdline(pid), "swrk") {
				continue
			}
			stat, _ := os.ReadFile("/proc/" + pid + "/stat")
			f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
			if len(f) < 2 || !strings.Contains(cmdline(f[1]), data) {
				continue
			}
			for time.Now().Before(deadline) {
				logs, _ := filepath.Glob(filepath.Join(staging, "*", "work", "dump.log"))
				for _, l := range logs {
					if b, _ := os.ReadFile(l); strings.Contains(string(b), "switched to daemon mode") {
						n, _ := strconv.Atoi(pid)
						if syscall.Kill(n, syscall.SIGKILL) == nil {
							return n
						}
					}
				}
				if _, err := os.Stat("/proc/" + pid); err != nil {
					break // the dump ended first
				}
				time.Sleep(200 * time.Microsecond)
			}
		}
		time.Sleep(time.Millisecond)
	}
	return 0
}

// TestMigrationFailures: a migration fails (1) when the target agent dies
// after it received the image, before it restored the rank: the job
// resumes where it was; (2) when CRIU is killed on the source in the
// middle of the dump, with its parasite inside the rank: the agent finds
// the rank damaged and the job restarts from its last checkpoint on the
// nodes it was on. Each failure is reported and recorded, and the ring
// still finishes with the result of an uninterrupted run.
func TestMigrationFailures(t *testing.T) {
	const messages = 2_000_000
	c, place, free := ringWithFreeNode(t, messages)
	c.OK("checkpoint", "ring")
	movesOn := func(what string) {
		t.Helper()
		if p := c.Status("ring").Placement; !slices.Equal(p, place) {
			t.Fatalf("after %s the job is on %v, want %v", what, p, place)
		}
		before := c.Progress("ring", 0)
		testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
			return c.Progress("ring", 0) > before, "the ring made no progress after " + what
		})
	}

	// 1. The target agent dies in the middle of the move.
	c.KillAgent(free)("CAIRN_FAILPOINT=migrate-in")
	c.WaitNodes(4, 30*time.Second)
	res := make(chan error, 1)
	go func() {
		out, err := c.Run("migrate", "ring/1", "--to", free)
		if err == nil {
			err = fmt.Errorf("migrate succeeded: %s", out)
		} else {
			t.Logf("migrate failed as it should: %s", strings.TrimSpace(out))
		}
		res <- err
	}()
	c.WaitAgentLog(free, "failpoint=migrate-in", 60*time.Second)
	restart := c.KillAgent(free)
	if err := <-res; strings.HasPrefix(err.Error(), "migrate succeeded") {
		t.Fatal(err)
	}
	movesOn("a target agent died")
	c.CheckNeverRestored("ring", 1)
	restart()
	c.WaitNodes(4, 30*time.Second)

	// 2. CRIU is killed on the source in the middle of the dump.
	src, _ := c.File().Node(place[2])
	failed := 0
	for try := 1; try <= 5 && failed == 0; try++ {
		go func() {
			out, err := c.Run("migrate", "ring/2", "--to", free)
			if err == nil {
				err = fmt.Errorf("migrate succeeded: %s", out)
			} else {
				t.Logf("migrate failed as it should: %s", strings.TrimSpace(out))
			}
			res <- err
		}()
		pid := killCRIUDump(src.Data, src.Staging, 60*time.Second)
		err := <-res
		if pid == 0 {
			// The dump ended before the kill: the rank moved. Move it back
			// and try again.
			t.Logf("try %d: the dump ended before CRIU could be killed (%v)", try, err)
			c.OK("migrate", "ring/2", "--to", place[2])
			continue
		}
		if strings.HasPrefix(err.Error(), "migrate succeeded") {
			t.Fatal(err)
		}
		failed = try
	}
	if failed == 0 {
		t.Fatal("CRIU could never be killed in the middle of a dump")
	}
	// The rank is damaged: the job restarts from checkpoint 1, its ranks
	// where their images are, i.e. where they were.
	testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
		j := c.Job("ring")
		return j.Restarts == 1 && j.State == "running", fmt.Sprintf("job %s, %d restarts (%s)", j.State, j.Restarts, j.Reason)
	})
	movesOn("CRIU was killed on the source")

	var ms []coordv1.Migration
	if err := json.Unmarshal([]byte(c.OK("migrations", "ring", "--json")), &ms); err != nil {
		t.Fatal(err)
	}
	last := ms[len(ms)-1]
	if ms[0].State != "failed" || last.State != "failed" || last.Rank != 2 {
		t.Fatalf("migrations recorded: %+v", ms)
	}
	evs := c.Events("--job", "ring")
	checkPhases(t, evs, ms[0].Seq, []string{"migration.started", "migration.stalled", "migration.failed"})
	checkPhases(t, evs, last.Seq, []string{"migration.started", "migration.failed"})
	var failMsg string
	restarted := false
	for _, e := range evs {
		if e.Type == "migration.failed" && e.Ckpt == last.Seq {
			failMsg = e.Message
		}
		if e.Type == "job.restarted" && e.Ckpt == 1 {
			restarted = true
		}
	}
	if !strings.Contains(failMsg, "parasite is still in pid") || !restarted {
		t.Fatalf("the damaged rank was not reported (%q) or the job not restarted from checkpoint 1 (%v)", failMsg, restarted)
	}
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	c.CheckRestarted("ring", 1, testutil.RingOutput)
}

// migrationState waits until migration seq of the ring is in state want
// and returns it.
func migrationState(t *testing.T, c *testutil.Cluster, seq int, want coordv1.MigrationState) coordv1.Migration {
	t.Helper()
	var m coordv1.Migration
	testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
		var ms []coordv1.Migration
		out, err := c.Run("migrations", "ring", "--json")
		if err != nil {
			return false, "no coordinator yet: " + out // it is starting
		}
		if err := json.Unmarshal([]byte(out), &ms); err != nil {
			t.Fatal(err)
		}
		for _, x := range ms {
			if x.Seq == seq {
				m = x
			}
		}
		return m.State == want, fmt.Sprintf("migration %d is %q, want %s", seq, m.State, want)
	})
	return m
}

// noHoldExpired fails t if an agent's log shows a hold expiring: a rank
// thawed, resumed or removed by its agent because no coordinator ended its
// prepare, stall or migration in time. Where the new coordinator finishes
// or undoes a protocol, this says it did so before the agents acted alone.
func noHoldExpired(t *testing.T, c *testutil.Cluster, what string) {
	t.Helper()
	for _, n := range c.Nodes {
		for _, line := range strings.Split(c.AgentLog(n), "\n") {
			if strings.Contains(line, "within the hold") {
				t.Fatalf("after %s, the agent of %s acted on its own at the end of its hold:\n%s", what, n, line)
			}
		}
	}
}

// TestCoordinatorDiesMidMigration: the coordinator dies (1) in the last
// phase of a migration, after the source was removed and the rank's new
// node recorded, before anything resumed; (3) in that phase between
// recording the new node and removing the source; (2) in its move phase,
// while the target receives the image. The next coordinator finishes the
// first two (the source's copy removed, every rank resumed, the rank on its
// target: never both copies running) and undoes the last (the job resumes
// where it was, the rank never restored), before any agent's hold ends, and
// the ring still finishes with the result of an uninterrupted run.
func TestCoordinatorDiesMidMigration(t *testing.T) {
	const messages = 2_000_000
	c, place, free := ringWithFreeNode(t, messages)
	progresses := func(what string) {
		t.Helper()
		before := c.Progress("ring", 0)
		testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
			return c.Progress("ring", 0) > before, "the ring made no progress after " + what
		})
	}
	migrateAsync := func(args ...string) {
		go func() { _, _ = c.Run(append([]string{"migrate"}, args...)...) }()
	}

	// 1. Dies in phase 4.
	c.KillCoordinator()(failpoint.Env + "=migration-before-resume")
	c.WaitNodes(4, 30*time.Second)
	migrateAsync("ring/1", "--to", free)
	c.WaitFailpoint("migration-before-resume", 60*time.Second)
	c.KillCoordinator()()
	m := migrationState(t, c, 1, "done")
	if p := c.Status("ring").Placement; p[1] != free || !strings.Contains(m.Reason, "restarted coordinator") {
		t.Fatalf("after recovery rank 1 is on %s (want %s), migration %+v", p[1], free, m)
	}
	noHoldExpired(t, c, "a migration finished by a new coordinator")
	progresses("a migration finished by a new coordinator")
	c.CheckRestored("ring", 1, m.Seq, testutil.RingOutput)

	// 3. Dies in phase 4 between recording the rank's new node and
	// removing the source's copy (place[1] is free since 1).
	c.KillCoordinator()(failpoint.Env + "=migration-before-remove")
	c.WaitNodes(4, 30*time.Second)
	migrateAsync("ring/0", "--to", place[1])
	c.WaitFailpoint("migration-before-remove", 60*time.Second)
	c.KillCoordinator()()
	m = migrationState(t, c, 2, "done")
	if p := c.Status("ring").Placement; p[0] != place[1] {
		t.Fatalf("after recovery rank 0 is on %s, want %s", p[0], place[1])
	}
	noHoldExpired(t, c, "a migration finished by a new coordinator after its record")
	progresses("a migration finished by a new coordinator after its record")
	c.CheckRestored("ring", 0, m.Seq, testutil.RingOutput)

	// 2. Dies in phase 2, the target receiving (place[0] is free since 3).
	c.KillAgent(place[0])("CAIRN_FAILPOINT=migrate-in")
	c.WaitNodes(4, 30*time.Second)
	migrateAsync("ring/2", "--to", place[0])
	c.WaitAgentLog(place[0], "failpoint=migrate-in", 60*time.Second)
	c.KillCoordinator()()
	m = migrationState(t, c, 3, "failed")
	if p := c.Status("ring").Placement; p[2] != place[2] {
		t.Fatalf("after the undo rank 2 is on %s, want %s", p[2], place[2])
	}
	noHoldExpired(t, c, "a migration undone by a new coordinator")
	progresses("a migration undone by a new coordinator")
	c.CheckNeverRestored("ring", 2)
	if got, want := c.Result("ring"), ringapp.Expected(3, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
}
