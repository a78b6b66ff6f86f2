package mpi

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/testutil"
)

// The mpi4py application of these tests: examples/mpi/life.py, the Game of
// Life on a 2048x2048 torus cut into one strip per rank, run with Debian
// 12's python3 and python3-mpi4py (built against Open MPI). Each
// generation exchanges halo rows between neighbouring ranks (MPI_Sendrecv);
// every lifeEvery generations the live and changed cells are summed over
// the ranks (MPI_Allreduce on 64-bit integers); at the end the strips are
// gathered on rank 0 (MPI_Gather), which prints the population and the
// SHA-256 of the whole board.
//
// Its output is deterministic: the initial board is SHA-256 of the seed and
// row number (no pseudo-random generator), every operation is on integers,
// the sums are of integers (exact in any reduction order) and the digest is
// of the gathered board, so the final line is the same for any run of the
// same arguments, interrupted or not (it is even the same for any number
// of ranks). Only its t= figure, elapsed seconds, varies.
var (
	lifePython = "/usr/bin/python3" // Debian's: mpi4py is installed for it
	lifeGens   = 3500
	lifeEvery  = 50
	lifeArgs   = []string{"--width", "2048", "--height", "2048", "--generations", strconv.Itoa(lifeGens), "--every", strconv.Itoa(lifeEvery), "--seed", "7"}
	lifeRanks  = 4
	lifeFinal  = regexp.MustCompile(`FINAL (width=\d+ height=\d+ generations=(\d+) population=\d+ sha256=[0-9a-f]{64})`)
	lifeGen    = regexp.MustCompile(`generation (\d+)/`)
	// lifeOutput: rank 0 prints the board's setup once, then every
	// lifeEvery generations.
	lifeOutput = testutil.Output{
		Start:    regexp.MustCompile(`at generation 0$`),
		Progress: regexp.MustCompile(`^generation (\d+)/`),
		Rank0:    true,
	}
)

// lifeScript copies examples/mpi/life.py to a directory of the test's own
// (which every rank sees, as it sees the host's files) and checks that
// mpi4py is installed.
func lifeScript(t *testing.T) string {
	t.Helper()
	if out, err := exec.Command(lifePython, "-c", "import mpi4py.MPI").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import mpi4py (make setup installs python3-mpi4py): %v\n%s", lifePython, err, out)
	}
	src, err := os.ReadFile("../../examples/mpi/life.py")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "cairn-life-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "life.py")
	if err := os.WriteFile(p, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// lifeResult is the final line of rank 0's output without its time: what
// every run of the same arguments prints.
func lifeResult(out string) string {
	m := lifeFinal.FindStringSubmatch(out)
	if m == nil || m[2] != strconv.Itoa(lifeGens) {
		return ""
	}
	return m[1]
}

// lifeProgress is the last generation rank 0 reported.
func lifeProgress(out string) int {
	m := lifeGen.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// TestMPI4PyCheckpointRestart runs a Python MPI application, unmodified, as
// a 4-rank Open MPI job on 4 nodes: it is checkpointed while it computes,
// then killed and restarted from that checkpoint with every rank on
// another node. Its final output equals that of an uninterrupted run of
// the same program computed in the same test (plain mpirun on the host),
// and it went on from the checkpoint rather than starting over.
func TestMPI4PyCheckpointRestart(t *testing.T) {
	script := lifeScript(t)

	// The uninterrupted run: plain mpirun on the host, over loopback.
	start := time.Now()
	ref := exec.Command("/usr/bin/mpirun.openmpi", append([]string{"--allow-run-as-root", "--oversubscribe", "-np", strconv.Itoa(lifeRanks),
		"--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo", lifePython, script}, lifeArgs...)...)
	out, err := ref.CombinedOutput()
	want := lifeResult(string(out))
	if err != nil || want == "" {
		t.Fatalf("uninterrupted run: %v\n%s", err, out)
	}
	t.Logf("uninterrupted run in %s: %s", time.Since(start).Round(time.Second), want)

	c := testutil.NewCluster(t, lifeRanks)
	c.OK(append([]string{"run", "--job", "life", "--ranks", strconv.Itoa(lifeRanks), "--per-node", "1", "--mpi", "openmpi", "--", lifePython, script}, lifeArgs...)...)
	// Checkpoint once the application is well into its computation.
	testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
		out := c.Logs("life", 0)
		return lifeProgress(out) >= lifeGens/4, "rank 0 of the application:\n" + out
	})
	c.OK("checkpoint", "life")
	atCkpt := lifeProgress(c.Logs("life", 0))
	if atCkpt >= lifeGens {
		t.Fatalf("the application had finished (generation %d) when it was checkpointed: lengthen it", atCkpt)
	}
	// It goes on computing after the checkpoint, then dies.
	testutil.WaitUntil(t, time.Minute, func() (bool, string) {
		out := c.Logs("life", 0)
		return lifeProgress(out) >= atCkpt+4*lifeEvery, "no progress after the checkpoint:\n" + out
	})
	c.OK("kill", "life")
	atKill := lifeProgress(c.Logs("life", 0))
	before := c.Status("life").Placement
	rotated := append(slices.Clone(before[1:]), before[0])
	c.OK("restart", "life", "--placement", strings.Join(rotated, ","))
	if got := c.Status("life").Placement; !slices.Equal(got, rotated) {
		t.Fatalf("restarted on %v, asked for %v", got, rotated)
	}
	if out, err := c.Run("wait", "life"); err != nil {
		t.Fatalf("wait: %v\n%s\nrank 0:\n%s", err, out, c.Logs("life", 0))
	}
	log := c.Logs("life", 0)
	if got := lifeResult(log); got != want {
		t.Fatalf("after a checkpoint at generation ~%d, kill and restart on other nodes the application printed\n  %q\nan uninterrupted run printed\n  %q\nrank 0:\n%s", atCkpt, got, want, log)
	}
	// Restarted from the checkpoint, not from the beginning: the
	// application set up its board once, before the checkpoint, and
	// counted on from there.
	c.CheckRestarted("life", 1, lifeOutput)
	t.Logf("checkpointed at generation ~%d, killed at ~%d, restarted on %v (was %v); the application's final line equals the uninterrupted run's", atCkpt, atKill, rotated, before)
	for r, st := range c.Status("life").RankStates {
		if st.Status != "exited" || st.ExitCode == nil || *st.ExitCode != 0 {
			code := "none"
			if st.ExitCode != nil {
				code = strconv.Itoa(*st.ExitCode)
			}
			t.Errorf("rank %d: %s, exit code %s", r, st.Status, code)
		}
	}
}
