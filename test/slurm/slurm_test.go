package slurm

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairn/internal/ringapp"
	"cairn/internal/testutil"
)

// TestJobAcrossAllocations: the ring job, submitted with sbatch and
// deploy/slurm/cairn.sbatch on 2 nodes with a one-minute time limit, is
// signalled before the limit in its first two allocations, stopped at a
// checkpoint each time, flushed to the tier and requeued; each next
// allocation restarts it from the tier; the third lets it finish, with
// exactly an uninterrupted run's result.
func TestJobAcrossAllocations(t *testing.T) {
	if os.Getenv("CAIRN_SLURM") == "" {
		t.Skip("a job across three allocations of a real Slurm, minutes of waiting for its time limits: CAIRN_SLURM=1 (make slurm)")
	}
	s := testutil.NewSlurm(t, 2)
	bin := testutil.CairnBinary(t)
	work := t.TempDir()
	tier := "file://" + t.TempDir() // every node's namespace sees this machine's files: a shared file system
	out := filepath.Join(work, "slurm.out")
	script, err := filepath.Abs("../../deploy/slurm/cairn.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	const messages = 400_000
	id := s.Sbatch([]string{"CAIRN=" + bin, "CAIRN_JOB=ring", "CAIRN_TIER=" + tier, "CAIRN_RUN_FLAGS=--per-node 1"},
		"--nodes=2", "--time=1", "--signal=B:USR1@35", "--output="+out, "--chdir="+work, "--job-name=ring",
		script, bin, "ringapp", "-messages", strconv.Itoa(messages), "-compute", "20000")
	// Slurm holds a requeued job a while before it runs again: released
	// at once. The third allocation has the time to finish.
	for restarts := 1; restarts <= 2; restarts++ {
		testutil.WaitUntil(t, 3*time.Minute, func() (bool, string) {
			j := s.Job(id)
			return j["Restarts"] == strconv.Itoa(restarts) && j["JobState"] == "PENDING", fmt.Sprintf("job %s, restarts %s; want requeued %d times\n%s", j["JobState"], j["Restarts"], restarts, tail(out))
		})
		if restarts == 2 {
			if o, err := s.Command("/usr/bin/scontrol", "update", "JobId="+strconv.Itoa(id), "TimeLimit=10").CombinedOutput(); err != nil {
				t.Fatalf("scontrol update: %v\n%s", err, o)
			}
		}
		s.Release(id)
	}
	testutil.WaitUntil(t, 8*time.Minute, func() (bool, string) {
		j := s.Job(id)
		return j["JobState"] == "COMPLETED" || j["JobState"] == "FAILED", fmt.Sprintf("job %s\n%s", j["JobState"], tail(out))
	})
	log := readFile(t, out)
	if j := s.Job(id); j["JobState"] != "COMPLETED" {
		t.Fatalf("job %s (exit %s):\n%s", j["JobState"], j["ExitCode"], log)
	}
	for _, want := range []string{"(run 1)", "(run 2)", "(run 3)", "restarted from checkpoint"} {
		if !strings.Contains(log, want) {
			t.Errorf("the job's output lacks %q:\n%s", want, log)
		}
	}
	if n := strings.Count(log, "stopped at checkpoint"); n != 2 {
		t.Errorf("the job was stopped %d times, want 2:\n%s", n, log)
	}
	m := regexp.MustCompile(`result=([0-9a-f]+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no result in the job's output:\n%s", log)
	}
	if want := ringapp.Expected(2, messages, 64, 1); m[1] != want {
		t.Fatalf("result %s, want %s (an uninterrupted run's):\n%s", m[1], want, log)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tail is the end of the job's output, for messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}
