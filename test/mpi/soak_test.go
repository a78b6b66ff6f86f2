package mpi

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/testutil"
)

// soakSize is the size of the soak's job: ranks ranks on nodes nodes
// (perNode on each), iters iterations of mib MiB per rank, and a spare
// node for rotations and migrations.
type soakSize struct {
	ranks, nodes, perNode int
	iters, mib            int
}

// reference runs the test program uninterrupted on the host, with plain
// mpirun, and returns its checksum and rank 0's progress lines.
func (s soakSize) reference(t *testing.T, args []string) (string, []string) {
	t.Helper()
	full := append([]string{"--allow-run-as-root", "--oversubscribe", "-np", fmt.Sprint(s.ranks), "--mca", "btl", "self,tcp",
		"--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo", mpiProgram(t, "openmpi")}, args...)
	out, err := exec.Command("/usr/bin/mpirun.openmpi", full...).CombinedOutput()
	m := mpiFinal.FindStringSubmatch(string(out))
	if err != nil || m == nil {
		t.Fatalf("reference run of %d ranks: %v\n%s", s.ranks, err, out)
	}
	return m[3], progressLines(string(out))
}

// envInt is the integer in environment variable name, or def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", name, v)
	}
	return n
}

// progressOf is the last iteration rank 0 of job printed.
func progressOf(c *testutil.Cluster, job string) int {
	m := mpiProgress.FindAllStringSubmatch(c.Logs(job, 0), -1)
	n := 0
	if len(m) > 0 {
		n, _ = strconv.Atoi(m[len(m)-1][1])
	}
	return n
}

// rotate moves every rank one node on in nodes.
func rotate(placement, nodes []string) []string {
	out := make([]string, len(placement))
	for r, n := range placement {
		out[r] = nodes[(slices.Index(nodes, n)+1)%len(nodes)]
	}
	return out
}

// leastUsed is the node of nodes with the fewest ranks in placement, other
// than not.
func leastUsed(placement, nodes []string, not string) string {
	best, fewest := "", len(placement)+1
	for _, n := range nodes {
		k := 0
		for _, p := range placement {
			if p == n {
				k++
			}
		}
		if n != not && k < fewest {
			best, fewest = n, k
		}
	}
	return best
}

// testMPISoak runs the test program as a job of 16 ranks on 4 nodes (4 on
// each, a fifth spare) through cycles of checkpoint, kill and restart
// with every rank one node on (CAIRN_SOAK_CYCLES, 100 by default), and
// live migrations of seeded random ranks to the least loaded node spread
// among them (CAIRN_SOAK_MIGRATIONS, 20): no step may hang (each is
// bounded), every restart goes on from the checkpoint just taken, and the
// job ends with exactly an uninterrupted run's checksum and progress
// lines.
func testMPISoak(t *testing.T, kind string) {
	soakOnly(t)
	cycles := envInt(t, "CAIRN_SOAK_CYCLES", 100)
	migrations := envInt(t, "CAIRN_SOAK_MIGRATIONS", 20)
	s := soakSize{ranks: 16, nodes: 4, perNode: 4, mib: 1}
	// Each cycle and migration waits for a progress line (5 more
	// iterations); the job runs on a little while its checkpoint begins,
	// the rest is rolled back by the restart. Three times that (the job
	// must not end before the last cycle), the rest of the run is what
	// the job does after it.
	const step = 5
	s.iters = (cycles+migrations)*step*3 + 100
	args := []string{"--iters", fmt.Sprint(s.iters), "--every", fmt.Sprint(step), "--mib", fmt.Sprint(s.mib), "--ring-kib", "64"}
	want, wantLog := s.reference(t, append(slices.Clone(args), "--sleep-ms", "0"))
	args = append(args, "--sleep-ms", "20")
	c := testutil.NewCluster(t, s.nodes+1)
	run := []string{"run", "--job", "soak", "--ranks", fmt.Sprint(s.ranks), "--per-node", fmt.Sprint(s.perNode),
		"--nodes", strings.Join(c.Nodes[:s.nodes], ","), "--mpi", kind, "--on-failure", "stop", "--", mpiProgram(t, kind)}
	c.OK(append(run, args...)...)
	rng := rand.New(rand.NewPCG(uint64(len(kind)), 7))
	migrateEvery := 0
	if migrations > 0 {
		migrateEvery = max(1, cycles/migrations)
	}
	start, moved := time.Now(), 0
	var ckptTook, restartTook []time.Duration
	advance := func(what string) {
		t.Helper()
		from := progressOf(c, "soak")
		if j := c.Job("soak"); j.State != "running" {
			t.Fatalf("the job is %s (%s) before %s, at iteration %d of %d: the soak must give it more iterations", j.State, j.Reason, what, from, s.iters)
		}
		testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
			return progressOf(c, "soak") > from, fmt.Sprintf("%s: no progress past iteration %d in 2 min (a hang):\n%s", what, from, c.Logs("soak", 0))
		})
	}
	for i := 1; i <= cycles || moved < migrations; i++ {
		if i <= cycles {
			advance(fmt.Sprintf("cycle %d", i))
			t0 := time.Now()
			c.OK("checkpoint", "soak")
			ckptTook = append(ckptTook, time.Since(t0))
			seq := c.Ckpts("soak")[len(c.Ckpts("soak"))-1].Seq
			c.OK("kill", "soak")
			next := rotate(c.Status("soak").Placement, c.Nodes)
			t0 = time.Now()
			c.OK("restart", "soak", "--from", fmt.Sprint(seq), "--placement", strings.Join(next, ","))
			restartTook = append(restartTook, time.Since(t0))
			if j := c.Job("soak"); j.RestoredFrom != seq || !slices.Equal(j.Placement, next) {
				t.Fatalf("cycle %d: restarted from %d on %v, want %d on %v", i, j.RestoredFrom, j.Placement, seq, next)
			}
		}
		if migrateEvery > 0 && moved < migrations && (i%migrateEvery == 0 || i > cycles) {
			advance(fmt.Sprintf("migration %d", moved+1))
			place := c.Status("soak").Placement
			r := rng.IntN(s.ranks)
			to := leastUsed(place, c.Nodes, place[r])
			if m := c.Migrate(fmt.Sprintf("soak/%d", r), "--to", to); m.State != "done" {
				t.Fatalf("migration %d of rank %d to %s: %s (%s)", moved+1, r, to, m.State, m.Reason)
			}
			moved++
		}
	}
	got := mpiResultOf(t, c, "soak", s.ranks, s.iters)
	if got != want {
		t.Fatalf("%s soak job's checksum %s after %d cycles and %d migrations; an uninterrupted run's is %s", kind, got, cycles, moved, want)
	}
	if log := progressLines(c.Logs("soak", 0)); !slices.Equal(log, wantLog) {
		t.Fatalf("rank 0's progress lines after the soak differ from an uninterrupted run's (%d lines, want %d)", len(log), len(wantLog))
	}
	slices.Sort(ckptTook)
	slices.Sort(restartTook)
	med := func(ds []time.Duration) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		return ds[len(ds)/2].Round(10 * time.Millisecond)
	}
	t.Logf("%s soak: %d ranks on %d nodes, %d cycles of checkpoint, kill and restart (checkpoint median %s, restart median %s), %d migrations, in %s; result exact",
		kind, s.ranks, s.nodes, cycles, med(ckptTook), med(restartTook), moved, time.Since(start).Round(time.Second))
}

// mpiResultOf waits for the job to end and returns the checksum rank 0
// printed, which must be that of ranks ranks and iters iterations.
func mpiResultOf(t *testing.T, c *testutil.Cluster, job string, ranks, iters int) string {
	t.Helper()
	// Not cairn wait, bounded at 3 min: the rest of a soak's run may
	// take longer.
	testutil.WaitUntil(t, 30*time.Minute, func() (bool, string) {
		j := c.Job(job)
		return j.State != "running", fmt.Sprintf("job %s still %s at iteration %d of %d", job, j.State, progressOf(c, job), iters)
	})
	if j := c.Job(job); j.State != "exited" {
		t.Fatalf("job %s ended %s (%s)\nrank 0:\n%s", job, j.State, j.Reason, c.Logs(job, 0))
	}
	m := mpiFinal.FindStringSubmatch(c.Logs(job, 0))
	if m == nil || m[1] != fmt.Sprint(ranks) || m[2] != fmt.Sprint(iters) {
		t.Fatalf("no final line of %d ranks and %d iterations in rank 0's output:\n%s", ranks, iters, c.Logs(job, 0))
	}
	return m[3]
}

func TestMPISoakOpenMPI(t *testing.T) { testMPISoak(t, "openmpi") }
func TestMPISoakMPICH(t *testing.T)   { testMPISoak(t, "mpich") }

// TestMPI64Ranks: a job of 64 small ranks (16 on each of 4 nodes) starts,
// is checkpointed, killed and restarted with every rank one node on, and
// ends with exactly an uninterrupted run's checksum.
func TestMPI64Ranks(t *testing.T) {
	soakOnly(t)
	s := soakSize{ranks: 64, nodes: 4, perNode: 16, iters: 60, mib: 1}
	args := []string{"--iters", fmt.Sprint(s.iters), "--every", "5", "--mib", "1", "--ring-kib", "16"}
	want, _ := s.reference(t, append(slices.Clone(args), "--sleep-ms", "0"))
	// All 64 ranks, the 5 agents and the coordinator share this machine's
	// 2 cores, where a cluster gives each node its own: a node TTL of 10 s
	// (4 by default), since 64 MPI ranks starting at once starved them
	// for longer than a lease (a node's heartbeat timed out, its lease
	// expired, its job was lost); and 3 min to prepare a round (20 s by
	// default), since 64 dumps at once took longer than 20 s.
	c := testutil.NewCluster(t, s.nodes+1, "--node-ttl", "10s", "--deadline", "3m")
	start := time.Now()
	c.OK(append([]string{"run", "--job", "big", "--ranks", "64", "--per-node", "16", "--nodes", strings.Join(c.Nodes[:s.nodes], ","),
		"--mpi", "openmpi", "--on-failure", "stop", "--", mpiProgram(t, "openmpi")}, append(args, "--sleep-ms", "200")...)...)
	started := time.Since(start)
	testutil.WaitUntil(t, 5*time.Minute, func() (bool, string) { return progressOf(c, "big") >= 10, c.Logs("big", 0) })
	t0 := time.Now()
	c.OK("checkpoint", "big")
	took := time.Since(t0)
	seq := c.Ckpts("big")[len(c.Ckpts("big"))-1].Seq
	c.OK("kill", "big")
	next := rotate(c.Status("big").Placement, c.Nodes)
	t0 = time.Now()
	c.OK("restart", "big", "--from", fmt.Sprint(seq), "--placement", strings.Join(next, ","))
	restarted := time.Since(t0)
	if got := mpiResultOf(t, c, "big", s.ranks, s.iters); got != want {
		t.Fatalf("64-rank job's checksum %s after checkpoint, kill and restart elsewhere; an uninterrupted run's is %s", got, want)
	}
	c.CheckRestarted("big", seq, mpiOutput)
	t.Logf("64 ranks: started in %s, checkpointed in %s, restarted in %s; result exact", started.Round(time.Millisecond), took.Round(time.Millisecond), restarted.Round(time.Millisecond))
}
