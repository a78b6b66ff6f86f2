package testutil

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/netw"
)

// Slurm is a real Slurm (Debian's slurm-wlm: munged, slurmctld and one
// slurmd per node) on this machine: each node is a network namespace on a
// bridge of the test's own, as a local cluster's nodes are, with a slurmd
// named after it (several slurmd on one machine, each with -N), and the
// controller listens on the bridge's gateway. Jobs run as root, in
// partition batch, which partition urgent's jobs preempt. Nothing
// of it listens beyond the bridge; the test's cleanup cancels every job,
// stops the daemons it started, by pid, and removes the namespaces, the
// bridge and its directory.
type Slurm struct {
	Conf  string   // slurm.conf: SLURM_CONF for every command
	Nodes []string // the nodes, as Slurm names them (= their namespaces)
	Dir   string

	t    testing.TB
	net  netw.Cluster
	pids []string // pid files of the daemons started
}

// SlurmGraceTime is how long a preempted job of partition batch has to
// end before it is killed and requeued.
const SlurmGraceTime = 90 * time.Second

// Slurm's daemons, as Debian installs them (make setup).
var slurmBins = []string{"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch", "/usr/bin/scontrol", "/usr/bin/srun"}

// NewSlurm starts a Slurm of n nodes and waits until every node is idle.
func NewSlurm(t testing.TB, n int) *Slurm {
	t.Helper()
	RequiresRoot(t)
	for _, b := range slurmBins {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("%s: %v (make setup installs Debian's slurm-wlm and munge)", b, err)
		}
	}
	r := randBytes(t, 3)
	dir, err := os.MkdirTemp("", "cairn-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Slurm{Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), t: t}
	prefix := "s" + hex.EncodeToString(r[:2]) + "-"
	underlay := netip.MustParsePrefix(fmt.Sprintf("10.218.%d.0/24", reserveUnderlay(t, r[2])))
	s.net, err = netw.NewCluster(prefix, underlay, n)
	if err != nil {
		t.Fatal(err)
	}
	s.net.HostAddr = true
	t.Cleanup(s.stop)
	ctx := context.Background()
	if err := s.net.Create(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"state", "spool", "log", "munge", "submit"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	key := filepath.Join(dir, "munge", "munge.key")
	if err := os.WriteFile(key, randBytes(t, 1024), 0o400); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "munge", "munge.sock")
	s.daemon(filepath.Join(dir, "munge", "munged.pid"), "/usr/sbin/munged", "--force", "--socket="+sock, "--key-file="+key,
		"--pid-file="+filepath.Join(dir, "munge", "munged.pid"), "--log-file="+filepath.Join(dir, "log", "munged.log"),
		"--seed-file="+filepath.Join(dir, "munge", "seed"))
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	gw := s.net.Underlay.Gateway()
	ports := freePorts(t, 2)
	var b strings.Builder
	fmt.Fprintf(&b, `ClusterName=cairntest
SlurmctldHost=%[1]s(%[2]s)
SlurmctldPort=%[3]d
SlurmdPort=%[4]d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%[5]s
CredType=cred/munge
StateSaveLocation=%[6]s/state
SlurmdSpoolDir=%[6]s/spool/%%n
SlurmctldPidFile=%[6]s/slurmctld.pid
SlurmdPidFile=%[6]s/slurmd-%%n.pid
SlurmctldLogFile=%[6]s/log/slurmctld.log
SlurmdLogFile=%[6]s/log/slurmd-%%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
ReturnToService=2
KillWait=10
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
`, host, gw, ports[0], ports[1], sock, dir)
	for _, nd := range s.net.Nodes {
		s.Nodes = append(s.Nodes, nd.Name)
		fmt.Fprintf(&b, "NodeName=%s NodeAddr=%s NodeHostname=%s CPUs=2 State=UNKNOWN\n", nd.Name, nd.Addr, host)
	}
	// Jobs run in "batch" unless they ask for "urgent", whose jobs
	// preempt batch's: requeued, after a grace time that starts with the
	// job's own --signal (preempt_send_user_signal).
	nodes := strings.Join(s.Nodes, ",")
	fmt.Fprintf(&b, "PartitionName=batch Nodes=%s Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=%d\n", nodes, int(SlurmGraceTime.Seconds()))
	fmt.Fprintf(&b, "PartitionName=urgent Nodes=%s MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF\n", nodes)
	if err := os.WriteFile(s.Conf, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	s.daemon(filepath.Join(dir, "slurmctld.pid"), "/usr/sbin/slurmctld")
	for _, nd := range s.net.Nodes {
		s.daemon(filepath.Join(dir, "slurmd-"+nd.Name+".pid"), "nsenter", "--net="+nd.Path(), "--", "/usr/sbin/slurmd", "-N", nd.Name)
	}
	WaitUntil(t, 60*time.Second, func() (bool, string) {
		out, err := s.Command("sinfo", "-h", "-p", "batch", "-o", "%t %D").CombinedOutput()
		return err == nil && strings.TrimSpace(string(out)) == fmt.Sprintf("idle %d", n), fmt.Sprintf("sinfo: %s %v", out, err)
	})
	return s
}

// daemon runs a daemon that forks into the background and writes its pid
// to pidFile, and notes it for the cleanup.
func (s *Slurm) daemon(pidFile string, argv ...string) {
	s.t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), s.Env()...)
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	s.pids = append(s.pids, pidFile)
	WaitUntil(s.t, 10*time.Second, func() (bool, string) {
		_, err := os.Stat(pidFile)
		return err == nil, fmt.Sprintf("%s wrote no %s", argv[0], pidFile)
	})
}

// Env is the environment of Slurm's commands for this Slurm.
func (s *Slurm) Env() []string { return []string{"SLURM_CONF=" + s.Conf} }

// Command is a Slurm command (sbatch, squeue, scontrol...) for this Slurm.
func (s *Slurm) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), s.Env()...)
	return cmd
}

// Sbatch runs sbatch with args (options, the script, its arguments) and
// env added to the environment it submits from, and returns the job's id.
// It submits from SubmitDir.
func (s *Slurm) Sbatch(env []string, args ...string) int {
	s.t.Helper()
	cmd := s.Command("/usr/bin/sbatch", append([]string{"--parsable"}, args...)...)
	cmd.Dir = s.SubmitDir()
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("sbatch %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	id, err := strconv.Atoi(strings.TrimSpace(strings.Split(string(out), ";")[0]))
	if err != nil {
		s.t.Fatalf("sbatch answered %q", out)
	}
	return id
}

// SubmitDir is the directory jobs are submitted from (their
// SLURM_SUBMIT_DIR), in the Slurm's directory.
func (s *Slurm) SubmitDir() string { return filepath.Join(s.Dir, "submit") }

// Job returns the fields of job id as scontrol shows them (JobState,
// Restarts, Reason, NodeList...).
func (s *Slurm) Job(id int) map[string]string {
	s.t.Helper()
	out, err := s.Command("/usr/bin/scontrol", "show", "job", "-o", strconv.Itoa(id)).CombinedOutput()
	if err != nil {
		s.t.Fatalf("scontrol show job %d: %v\n%s", id, err, out)
	}
	f := map[string]string{}
	for _, w := range strings.Fields(string(out)) {
		if k, v, ok := strings.Cut(w, "="); ok {
			f[k] = v
		}
	}
	return f
}

// Release lets pending job id start now: Slurm holds a requeued job a
// while before it runs again (its begin time, which may be set only after
// the job shows as pending). It waits first for the job's last allocation
// to be over on every node (none completing), and for the second of its
// requeue to pass: a slurmd revokes the job's credentials as of the second
// it ends it, so a start within that same second is killed ("job
// credential revoked").
func (s *Slurm) Release(id int) {
	s.t.Helper()
	WaitUntil(s.t, time.Minute, func() (bool, string) {
		out, err := s.Command("sinfo", "-h", "-N", "-p", "batch", "-o", "%t").CombinedOutput()
		return err == nil && !slices.ContainsFunc(strings.Fields(string(out)), func(st string) bool { return strings.HasPrefix(st, "comp") }),
			fmt.Sprintf("nodes still completing a job: %s %v", out, err)
	})
	time.Sleep(2 * time.Second)
	if j := s.Job(id); j["JobState"] == "PENDING" {
		if out, err := s.Command("/usr/bin/scontrol", "update", "JobId="+strconv.Itoa(id), "StartTime=now").CombinedOutput(); err != nil {
			s.t.Fatalf("scontrol update JobId=%d StartTime=now: %v\n%s", id, err, out)
		}
	}
}

// stop cancels every job, waits for them to end, stops the daemons and
// removes the namespaces, the bridge and the directory.
func (s *Slurm) stop() {
	if s.t.Failed() {
		s.logTails()
	}
	_ = s.Command("/usr/bin/scancel", "--full", "--user=root").Run()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out, err := s.Command("/usr/bin/squeue", "-h").Output()
		if err != nil || strings.TrimSpace(string(out)) == "" {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for i := len(s.pids) - 1; i >= 0; i-- {
		b, err := os.ReadFile(s.pids[i])
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 1 {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGTERM)
		waitGone(s.t, pid)
	}
	if err := s.net.Delete(context.Background()); err != nil {
		s.t.Errorf("remove Slurm's nodes: %v", err)
	}
	os.RemoveAll(s.Dir)
}

// logTails logs the end of the controller's and every slurmd's log, for a
// failed test.
func (s *Slurm) logTails() {
	logs, _ := filepath.Glob(filepath.Join(s.Dir, "log", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		s.t.Logf("--- %s:\n%s", filepath.Base(l), b)
	}
}
