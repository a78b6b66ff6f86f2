package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// BenchmarkRecovery measures how long the cluster takes to get over a
// death in the middle of a protocol, where the end-to-end tests
// (test/ckpt/rounds_test.go, test/migrate/migrate_test.go) check only what
// happens:
//
//   - a round whose participant's agent dies once its rank is prepared
//     (failpoint prepared) aborts: from the kill to the checkpoint's
//     answer, next to a round that commits, in the same run (the round's
//     deadline, 60 s, is far off: the abort is the death's);
//   - a migration whose coordinator dies before anything resumed
//     (failpoint migration-before-resume) is finished by the next
//     coordinator: from its start to the migration done, next to a
//     migration nothing interrupts and to the agents' hold, which would
//     end it otherwise.
//
// The ranks of a 3-rank ring on 4 nodes. Medians of CAIRN_BENCH_ROUNDS
// (default 3) of each.
func BenchmarkRecovery(b *testing.B) {
	rounds := envInt("CAIRN_BENCH_ROUNDS", 3)
	const deadline = 60 * time.Second
	c := testutil.NewCluster(b, 4, "--deadline", deadline.String())
	c.OK("run", "--job", "rec", "--ranks", "3", "--per-node", "1", "--replicas", "0", "--", c.Bin, "ringapp", "-messages", "1000000000")
	c.WaitProgress("rec", 3, 0, time.Minute)
	home := c.Status("rec").Placement
	free := ""
	for _, n := range c.Nodes {
		if !slices.Contains(home, n) {
			free = n
		}
	}
	victim := home[1]
	agentLog := filepath.Join(c.Data, "cluster", "nodes", victim, "agent.log")
	count := func(path, s string) int {
		out, _ := os.ReadFile(path)
		return strings.Count(string(out), s)
	}
	// The victim's agent holds every prepare while armed exists.
	armed := filepath.Join(b.TempDir(), "armed")
	withFailpoint := func(restart func(env ...string)) {
		joined := count(agentLog, `msg="joined the cluster"`)
		restart(failpoint.Env+"=prepared", failpoint.ArmedEnv+"="+armed)
		testutil.WaitUntil(b, time.Minute, func() (bool, string) {
			return count(agentLog, `msg="joined the cluster"`) > joined, victim + "'s agent did not join again"
		})
	}
	withFailpoint(c.KillAgent(victim))

	var commit, abort []time.Duration
	for range rounds {
		start := time.Now()
		c.OK("checkpoint", "rec")
		commit = append(commit, time.Since(start))

		held := count(agentLog, "failpoint=prepared")
		if err := os.WriteFile(armed, nil, 0o600); err != nil {
			b.Fatal(err)
		}
		done := c.CheckpointAsync("rec")
		testutil.WaitUntil(b, time.Minute, func() (bool, string) {
			return count(agentLog, "failpoint=prepared") > held, victim + "'s agent never held a prepare"
		})
		start = time.Now()
		restart := c.KillAgent(victim)
		err := <-done
		abort = append(abort, time.Since(start))
		if err == nil || !strings.Contains(err.Error(), "abort") {
			b.Fatalf("a round whose participant died: %v, want aborted", err)
		}
		os.Remove(armed)
		withFailpoint(restart)
		c.Moves("rec", 3, time.Minute)
	}

	coordLog := filepath.Join(c.Data, "cluster", "coordinator", "coordinator.log")
	// migrations lists the job's migrations, none while no coordinator answers.
	migrations := func() []coordv1.Migration {
		var ms []coordv1.Migration
		if out, err := c.Run("migrations", "rec", "--json"); err == nil {
			_ = json.Unmarshal([]byte(out), &ms)
		}
		return ms
	}
	var migrate, finish []time.Duration
	for range rounds {
		start := time.Now()
		c.OK("migrate", "rec/1", "--to", free)
		migrate = append(migrate, time.Since(start))

		c.KillCoordinator()(failpoint.Env + "=migration-before-resume")
		c.WaitNodes(4, time.Minute)
		held := count(coordLog, "failpoint=migration-before-resume")
		n := len(migrations())
		go func() { _, _ = c.Run("migrate", "rec/1", "--to", home[1]) }()
		testutil.WaitUntil(b, time.Minute, func() (bool, string) {
			return count(coordLog, "failpoint=migration-before-resume") > held, "the coordinator never held the migration"
		})
		restart := c.KillCoordinator()
		start = time.Now()
		restart()
		testutil.WaitUntil(b, 5*time.Minute, func() (bool, string) {
			ms := migrations()
			return len(ms) > n && ms[n].State == coordv1.MigrationDone, "the held migration is not done"
		})
		finish = append(finish, time.Since(start))
		c.Moves("rec", 3, time.Minute)
	}
	hold := deadline + 10*time.Second + time.Minute // the agents' hold of a migration: the coordinator's hold + 1 minute
	b.Logf("a round whose participant's agent dies once prepared aborts %s after the kill; a round that commits takes %s (medians of %d)",
		median(abort).Round(time.Millisecond), median(commit).Round(time.Millisecond), len(abort))
	b.Logf("a migration whose coordinator died before anything resumed is done %s after the next coordinator starts; one nothing interrupts takes %s; without a coordinator the agents' hold (%s) would end it",
		median(finish).Round(time.Millisecond), median(migrate).Round(time.Millisecond), hold)
	b.ReportMetric(ms(median(abort)), "abort-after-death-ms")
	b.ReportMetric(float64(median(abort))/float64(median(commit)), "abort/commit")
	b.ReportMetric(ms(median(finish)), "migration-finished-ms")
	b.ReportMetric(float64(median(finish))/float64(median(migrate)), "finished/migration")
	c.OK("rm", "-f", "rec")
}
