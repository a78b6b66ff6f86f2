package bench

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// BenchmarkMigration measures moving one rank of a 4-rank job to another
// node (cairn migrate) next to what a migration replaces, measured in the
// same run on the same job: a global checkpoint followed by a whole-job
// restart with that rank on the other node. Each rank holds
// CAIRN_BENCH_MIG_MIB (default 1024) MiB of random memory, so its image is
// what moves. It reports both totals and the job's stall (ranks frozen or
// down), and the migration's stall next to the image size divided by the
// raw TCP throughput between the two nodes (how close the pipeline gets
// to the link). Medians of CAIRN_BENCH_ROUNDS (default 3) of each.
//
// A post-copy migration (--post-copy) of the same rank follows each
// round: its stall next to the global checkpoint's (target <= 0.5), and
// the time from its start until every page has arrived on the target
// next to the stop-and-copy migration's stall (target <= 1.5).
func BenchmarkMigration(b *testing.B) {
	mib := envInt("CAIRN_BENCH_MIG_MIB", 1024)
	rounds := envInt("CAIRN_BENCH_ROUNDS", 3)
	c := testutil.NewCluster(b, 5)
	c.OK("run", "--job", "mig", "--ranks", "4", "--per-node", "1", "--replicas", "0", "--", c.Bin, "stateapp", "-no-stream",
		"-mem", strconv.Itoa(mib), "-dirty-every", "0", "-dir", "/var/lib/stateapp")
	time.Sleep(time.Duration(mib/32+3) * time.Second) // the memory is written
	var st coordv1.JobStatus
	if err := json.Unmarshal([]byte(c.OK("ps", "--job", "mig", "--json")), &st); err != nil {
		b.Fatal(err)
	}
	home := st.Placement
	free := ""
	for _, n := range c.Nodes {
		if !slices.Contains(home, n) {
			free = n
		}
	}
	var migTotal, migStall, ckTotal, ckStall, rsTotal []time.Duration
	var dump, move, restore, resume []time.Duration
	var pcStall, pcAll, pcDump, pcMove, pcRestore, pcResume []time.Duration
	var bytes int64
	for i := 0; i < rounds; i++ {
		// Migration there and back: two samples.
		for _, to := range []string{free, home[0]} {
			start := time.Now()
			var m coordv1.Migration
			if err := json.Unmarshal([]byte(c.OK("migrate", "mig/0", "--to", to, "--json")), &m); err != nil {
				b.Fatal(err)
			}
			migTotal, migStall, bytes = append(migTotal, time.Since(start)), append(migStall, m.Stall), m.Bytes
			dump, move, restore, resume = append(dump, m.Dump), append(move, m.Move), append(restore, m.Restore), append(resume, m.Resume)
		}
		// Checkpoint, then restart the whole job with rank 0 elsewhere.
		start := time.Now()
		var ck coordv1.Ckpt
		if err := json.Unmarshal([]byte(c.OK("checkpoint", "mig", "--json")), &ck); err != nil {
			b.Fatal(err)
		}
		ckTotal, ckStall = append(ckTotal, time.Since(start)), append(ckStall, ck.Stall)
		placement := fmt.Sprintf("%s,%s,%s,%s", free, home[1], home[2], home[3])
		start = time.Now()
		c.OK("restart", "mig", "--placement", placement)
		rsTotal = append(rsTotal, time.Since(start))
		// And back, so the next round starts from the same placement.
		c.OK("migrate", "mig/0", "--to", home[0])
		// Post-copy there, and back stop-and-copy once every page is there.
		m, all := postCopy(b, c, "mig/0", free)
		pcStall, pcAll = append(pcStall, m.Stall), append(pcAll, all)
		pcDump, pcMove, pcRestore, pcResume = append(pcDump, m.Dump), append(pcMove, m.Move), append(pcRestore, m.Restore), append(pcResume, m.Resume)
		c.OK("migrate", "mig/0", "--to", home[0])
	}
	tcp := rawTCP(b, c, home[0], free, bytes)
	mt, ms := median(migTotal), median(migStall)
	alt := median(ckTotal) + median(rsTotal)
	altStall := median(ckStall) + median(rsTotal) // every rank is down while the job restarts
	link := time.Duration(float64(bytes) / tcp * float64(time.Second))
	b.Logf("migration of one %d MiB rank of 4: %s in all, job stalled %s (medians of %d)", mib, mt.Round(time.Millisecond), ms.Round(time.Millisecond), len(migTotal))
	r := func(ds []time.Duration) time.Duration { return median(ds).Round(time.Millisecond) }
	b.Logf("  its phases: dump %s (the other ranks frozen meanwhile), move %s, restore %s, resume %s (source removed, job networks updated, all thawed)",
		r(dump), r(move), r(restore), r(resume))
	b.Logf("checkpoint + whole-job restart instead: %s in all (checkpoint %s, restart %s), job stalled %s",
		alt.Round(time.Millisecond), median(ckTotal).Round(time.Millisecond), median(rsTotal).Round(time.Millisecond), altStall.Round(time.Millisecond))
	b.Logf("ratio migration / checkpoint+restart: total %.2f, stall %.2f (target <= 0.5)", mt.Seconds()/alt.Seconds(), ms.Seconds()/altStall.Seconds())
	b.Logf("stall %s next to image %s / raw TCP %.0f MiB/s = %s: %.1fx the link time",
		ms.Round(time.Millisecond), fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20)), tcp/(1<<20), link.Round(time.Millisecond), ms.Seconds()/link.Seconds())
	b.Logf("post-copy: job stalled %s (dump %s, move %s, restore %s, resume %s), every page on the target %s after the start (medians of %d)",
		r(pcStall), r(pcDump), r(pcMove), r(pcRestore), r(pcResume), r(pcAll), len(pcStall))
	b.Logf("ratio post-copy stall / global checkpoint stall %.2f (target <= 0.5); stop-and-copy stall / global checkpoint stall %.2f",
		median(pcStall).Seconds()/median(ckStall).Seconds(), ms.Seconds()/median(ckStall).Seconds())
	b.Logf("ratio post-copy every page there / stop-and-copy stall %.2f (target <= 1.5)", median(pcAll).Seconds()/ms.Seconds())
	r2 := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	record(b,
		atMost(fmt.Sprintf("migration stall (post-copy) ÷ global checkpoint stall, %d MiB rank", mib), median(pcStall).Seconds()/median(ckStall).Seconds(), 0.5,
			fmt.Sprintf("%s / %s", r2(median(pcStall)), r2(median(ckStall)))),
		atMost(fmt.Sprintf("post-copy: every page there ÷ stop-and-copy stall, %d MiB rank", mib), median(pcAll).Seconds()/ms.Seconds(), 1.5,
			fmt.Sprintf("%s / %s", r2(median(pcAll)), r2(ms))))
}

// pageDoneRE is a target agent's log line for a post-copy migration whose
// every page has arrived, with its time.
var pageDoneRE = regexp.MustCompile(`time=(\S+) level=INFO msg="post-copy migration: every page is here" ckpt=(\S+)`)

// postCopy migrates rank (JOB/RANK) to node with --post-copy and returns
// its record and the time from its start until every page was on node.
func postCopy(b *testing.B, c *testutil.Cluster, rank, node string) (coordv1.Migration, time.Duration) {
	b.Helper()
	start := time.Now()
	var m coordv1.Migration
	if err := json.Unmarshal([]byte(c.OK("migrate", rank, "--to", node, "--post-copy", "--json")), &m); err != nil {
		b.Fatal(err)
	}
	ckpt := fmt.Sprintf("%s.%d:%d", m.Job, m.Rank, m.Seq)
	var at time.Time
	testutil.WaitUntil(b, 5*time.Minute, func() (bool, string) {
		for _, l := range pageDoneRE.FindAllStringSubmatch(c.AgentLog(node), -1) {
			if l[2] == ckpt {
				at, _ = time.Parse(time.RFC3339Nano, l[1])
				return true, ""
			}
		}
		return false, "the post-copy migration's pages never all arrived"
	})
	return m, at.Sub(start)
}
