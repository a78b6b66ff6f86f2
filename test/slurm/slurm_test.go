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

	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// ringJob is the ring job submitted with deploy/slurm/cairn.sbatch.
type ringJob struct {
	s        *testutil.Slurm
	id       int
	messages int
	out      string // its output, every allocation's
	local    string // TMPDIR: each node's data, while an allocation runs
}

// submit submits the ring job of messages on 2 nodes with opts (--time, --signal),
// its durable tier a directory of this machine, which every node's
// namespace sees: a shared file system.
func submit(t *testing.T, s *testutil.Slurm, messages int, opts ...string) *ringJob {
	bin := testutil.CairnBinary(t)
	work := t.TempDir()
	j := &ringJob{s: s, messages: messages, out: filepath.Join(work, "slurm.out"), local: filepath.Join(work, "local")}
	if err := os.Mkdir(j.local, 0o700); err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs("../../deploy/slurm/cairn.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"CAIRN=" + bin, "CAIRN_JOB=ring", "CAIRN_TIER=file://" + t.TempDir(), "CAIRN_RUN_FLAGS=--per-node 1", "TMPDIR=" + j.local}
	args := append([]string{"--nodes=2", "--output=" + j.out, "--chdir=" + work, "--job-name=ring"}, opts...)
	args = append(args, script, bin, "ringapp", "-messages", strconv.Itoa(messages), "-compute", "20000")
	j.id = s.Sbatch(env, args...)
	return j
}

// waitRequeued waits until the job has been requeued n times.
func (j *ringJob) waitRequeued(t *testing.T, n int) {
	t.Helper()
	testutil.WaitUntil(t, 4*time.Minute, func() (bool, string) {
		f := j.s.Job(j.id)
		return f["Restarts"] == strconv.Itoa(n) && f["JobState"] == "PENDING",
			fmt.Sprintf("job %s, restarts %s; want requeued %d times\n%s", f["JobState"], f["Restarts"], n, tail(j.out))
	})
}

// check waits for the job to end, and checks that it ran in allocs
// allocations, stopped at a checkpoint at the end of each but the last,
// restarted each next one from the tier with the tier's chunks (each
// allocation's nodes start with no data: the previous allocation's agents
// removed theirs), and ended with an uninterrupted run's result.
func (j *ringJob) check(t *testing.T, allocs int) {
	t.Helper()
	testutil.WaitUntil(t, 8*time.Minute, func() (bool, string) {
		f := j.s.Job(j.id)
		return f["JobState"] == "COMPLETED" || f["JobState"] == "FAILED", fmt.Sprintf("job %s\n%s", f["JobState"], tail(j.out))
	})
	log := readFile(t, j.out)
	agents := readFile(t, filepath.Join(j.s.SubmitDir(), ".cairn", strconv.Itoa(j.id), "agents.log"))
	t.Logf("the job's output:\n%s", log)
	if f := j.s.Job(j.id); f["JobState"] != "COMPLETED" {
		t.Fatalf("job %s (exit %s):\n%s\nagents:\n%s", f["JobState"], f["ExitCode"], log, agents)
	}
	for n := 1; n <= allocs; n++ {
		if want := fmt.Sprintf("(run %d)", n); !strings.Contains(log, want) {
			t.Errorf("the job's output lacks %q", want)
		}
	}
	if n := strings.Count(log, "stopped at checkpoint"); n != allocs-1 {
		t.Errorf("the job was stopped %d times, want %d", n, allocs-1)
	}
	if n := strings.Count(log, "restarted from checkpoint"); n != allocs-1 {
		t.Errorf("the job was restarted %d times, want %d", n, allocs-1)
	}
	// Every rank's image of every restart came from the tier.
	fetched := regexp.MustCompile(`fetched from the durable tier.* new_chunks=(\d+) bytes=(\d+)`).FindAllStringSubmatch(agents, -1)
	if len(fetched) != 2*(allocs-1) {
		t.Errorf("%d ranks' images fetched from the tier, want %d:\n%s", len(fetched), 2*(allocs-1), agents)
	}
	for _, m := range fetched {
		if m[1] == "0" {
			t.Errorf("a restart fetched no chunk from the tier: its node held the image already (%s)", m[0])
		} else {
			t.Logf("%s", m[0])
		}
	}
	if left, _ := os.ReadDir(j.local); len(left) != 0 {
		t.Errorf("the nodes' data is left in %s after the job: %v", j.local, left)
	}
	m := regexp.MustCompile(`result=([0-9a-f]+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no result in the job's output")
	}
	if want := ringapp.Expected(2, j.messages, 64, 1); m[1] != want {
		t.Fatalf("result %s, want %s (an uninterrupted run's)", m[1], want)
	}
}

// TestJobAcrossAllocations: the ring job, with a one-minute time limit, is
// signalled before the limit in its first two allocations, stopped at a
// checkpoint each time, flushed to the tier and requeued; each next
// allocation restarts it from the tier; the third, given the time, lets it
// finish with exactly an uninterrupted run's result.
func TestJobAcrossAllocations(t *testing.T) {
	s := testutil.NewSlurm(t, 2)
	// Two minutes of work (the ring passes about 7,000 messages a second
	// on 2 nodes here): about 25 s in each of the first two allocations.
	j := submit(t, s, 800_000, "--time=1", "--signal=B:USR1@35")
	j.waitRequeued(t, 1)
	s.Release(j.id) // Slurm holds a requeued job a while before it runs again
	j.waitRequeued(t, 2)
	if o, err := s.Command("/usr/bin/scontrol", "update", "JobId="+strconv.Itoa(j.id), "TimeLimit=10").CombinedOutput(); err != nil {
		t.Fatalf("scontrol update: %v\n%s", err, o)
	}
	s.Release(j.id)
	j.check(t, 3)
}

// TestPreemptedJobFinishesNextAllocation: the ring job runs in partition
// batch, with time enough; a job of partition urgent preempts it (grace
// time, preempt_send_user_signal: the job's --signal at once). The job is
// stopped at a checkpoint, flushed and requeued, the urgent job runs on
// its nodes, and the job's next allocation restarts it from the tier and
// finishes it, exactly.
func TestPreemptedJobFinishesNextAllocation(t *testing.T) {
	s := testutil.NewSlurm(t, 2)
	j := submit(t, s, 400_000, "--time=10", "--signal=B:USR1@60")
	testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
		b, _ := os.ReadFile(j.out)
		return strings.Contains(string(b), "job ring: 2 ranks"), "the job never ran:\n" + tail(j.out)
	})
	time.Sleep(10 * time.Second) // well into its work
	urgent := s.Sbatch(nil, "--partition=urgent", "--nodes=2", "--time=1", "--output=/dev/null", "--wrap", "sleep 5")
	j.waitRequeued(t, 1)
	s.Release(j.id)
	testutil.WaitUntil(t, 2*time.Minute, func() (bool, string) {
		f := s.Job(urgent)
		return f["JobState"] == "COMPLETED", "the urgent job is " + f["JobState"]
	})
	u := s.Job(urgent)
	t.Logf("the urgent job ran %s to %s on %s", u["StartTime"], u["EndTime"], u["NodeList"])
	j.check(t, 2)
	if log := readFile(t, j.out); !strings.Contains(log, "stopping ring at a checkpoint") {
		t.Errorf("the preempted job's script was not signalled")
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
