package ops

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/pty"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// exitCode is the exit code of a cairn run (0 when it succeeded).
func exitCode(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	if err == nil {
		return 0
	}
	if !errors.As(err, &ee) {
		t.Fatalf("cairn did not run: %v", err)
	}
	return ee.ExitCode()
}

// TestClusterCLISafety: a job is signalled as asked (TERM reaches the
// ranks' trap, it is not turned into SIGKILL); rm refuses a running job
// or one with checkpoints unless -f, and then says what it deleted; what
// does not exist on the cluster exits 3 (a slip of a job's name says
// which job was meant), a bad name exits 2, and a flag that does not
// apply is a usage error.
func TestClusterCLISafety(t *testing.T) {
	c := testutil.NewCluster(t, 2)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"restart", "nosuch"}, 3},
		{[]string{"migrate", "nosuch/0"}, 3},
		{[]string{"checkpoint", "nosuch"}, 3},
		{[]string{"restart", "../x"}, 2},
		{[]string{"kill", "-s", "BOGUS", "nosuch"}, 2},
		{[]string{"run", "--job", "j", "--ranks", "2", "--userns", "--", "true"}, 2},
		{[]string{"run", "--job", "j", "--ranks", "2", "--", "/no/such/program"}, 2},
		{[]string{"run", "--job", "j", "--ranks", "2", "--mpi", "openmpi", "--", "no-such-program"}, 2},
		{[]string{"run", "--job", "j", "--ranks", "2", "--volume", "/var/lib/cairn:/x", "--", "true"}, 2},
	} {
		out, err := c.Run(tc.args...)
		if code := exitCode(t, err); code != tc.code {
			t.Errorf("cairn %s: exit %d, want %d\n%s", strings.Join(tc.args, " "), code, tc.code, out)
		}
	}

	c.OK("run", "--job", "sig", "--ranks", "2", "--", "sh", "-c",
		`trap 'echo "got TERM"; exit 7' TERM; echo up; while :; do sleep 0.1; done`)
	for r := range 2 {
		testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
			out := c.Logs("sig", r)
			return strings.Contains(out, "up"), out
		})
	}
	if out := c.OK("logs", "sig/1", "--tail", "1"); out != "up\n" {
		t.Errorf("logs sig/1 --tail 1: %q", out)
	}
	if out := c.OK("logs", "sig", "--tail", "1"); out != "1: up\n" {
		t.Errorf("logs sig --tail 1: %q", out)
	}
	if out, err := c.Run("logs", "-f", "--tail", "1", "sig/0"); exitCode(t, err) != 2 {
		t.Errorf("logs -f --tail of a rank: %v\n%s", err, out)
	}
	testExecInRank(t, c)
	completeClusterNames(t, c)
	if out, err := c.Run("rm", "sig"); exitCode(t, err) != 1 || !strings.Contains(out, "running") {
		t.Errorf("rm of a running job without -f: %v\n%s", err, out)
	}
	// A slip of the job's name: not found, the job named, and what exists.
	for _, args := range [][]string{{"logs", "sgi"}, {"kill", "sigg"}, {"wait", "siig"}} {
		out, err := c.Run(args...)
		want := map[string]int{"wait": 125}[args[0]]
		if want == 0 {
			want = 3
		}
		if code := exitCode(t, err); code != want || !strings.Contains(out, "no container or job "+args[1]+"; did you mean sig?") || !strings.Contains(out, "; jobs: sig") {
			t.Errorf("cairn %s: exit %d, want %d naming job sig and the jobs:\n%s", strings.Join(args, " "), code, want, out)
		}
	}
	c.OK("kill", "-s", "TERM", "sig")
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		st := c.Status("sig")
		done := true
		for _, r := range st.RankStates {
			done = done && r.Status == "exited" && r.ExitCode != nil && *r.ExitCode == 7
		}
		return done, "ranks did not exit 7 after TERM"
	})
	if out := c.Logs("sig", 1); !strings.Contains(out, "got TERM") {
		t.Errorf("rank 1 never saw TERM:\n%s", out)
	}
	// wait --json: the job's ranks as they ended, and its exit code.
	cmd := exec.Command(c.Bin, "--data", c.Data, "wait", "sig", "--json")
	out, err := cmd.Output()
	var st testutil.JobStatus
	if code := exitCode(t, err); code != 7 || json.Unmarshal(out, &st) != nil || len(st.RankStates) != 2 || st.RankStates[1].ExitCode == nil || *st.RankStates[1].ExitCode != 7 {
		t.Errorf("wait sig --json: exit %d, %s", code, out)
	}
	// Ended and without checkpoints: rm needs no -f.
	if out := c.OK("rm", "sig", "--json"); !strings.Contains(out, `"kind": "job"`) || !strings.Contains(out, `"ckpts": 0`) {
		t.Errorf("rm --json: %s", out)
	}
	if out, err := c.Run("rm", "sig"); exitCode(t, err) != 3 {
		t.Errorf("rm of a removed job: %v\n%s", err, out)
	}
}

// testExecInRank: `cairn exec JOB/RANK` runs a command in that rank on
// its node: its stdout and stderr apart, its exit code; -i streams this
// stdin to it; cairn's own failures exit 125/126/127 as on a container;
// -it runs it on a terminal (execOnTerminal). Ranks of job sig run.
func testExecInRank(t *testing.T, c *testutil.Cluster) {
	t.Helper()
	cmd := exec.Command(c.Bin, "--data", c.Data, "exec", "sig/1", "--", "sh", "-c", "echo rank=$CAIRN_RANK; echo oops >&2; exit 5")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if code := exitCode(t, cmd.Run()); code != 5 || stdout.String() != "rank=1\n" || stderr.String() != "oops\n" {
		t.Errorf("exec sig/1: exit %d, stdout %q, stderr %q; want 5, rank=1, oops", code, stdout.String(), stderr.String())
	}
	// -i: this stdin, streamed; a big one, to cross frames and windows.
	in := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	cmd = exec.Command(c.Bin, "--data", c.Data, "exec", "-i", "sig/0", "--", "sh", "-c", "wc -c; echo done >&2")
	cmd.Stdin = strings.NewReader(in)
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != fmt.Sprint(len(in)) {
		t.Errorf("exec -i sig/0 -- wc -c of %d bytes: %v, %q", len(in), err, out)
	}
	// Without -i, no input: cat ends at once.
	cmd = exec.Command(c.Bin, "--data", c.Data, "exec", "sig/0", "--", "cat")
	cmd.Stdin = strings.NewReader("not for cat\n")
	if out, err := cmd.CombinedOutput(); err != nil || len(out) != 0 {
		t.Errorf("exec without -i -- cat: %v, %q; want no input, no output", err, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"exec", "sig/1", "--", "no-such-command"}, 127, "no-such-command"},
		{[]string{"exec", "sig/1", "--", "/etc/passwd"}, 126, "not an executable file"},
		{[]string{"exec", "sig/7", "--", "true"}, 125, "ranks 0..1"},
		{[]string{"exec", "nosuch/0", "--", "true"}, 125, "nosuch"},
	} {
		out, err := c.Run(tc.args...)
		if code := exitCode(t, err); code != tc.code || !strings.Contains(out, tc.says) {
			t.Errorf("cairn %s: exit %d, want %d saying %q:\n%s", strings.Join(tc.args, " "), code, tc.code, tc.says, out)
		}
	}
	execOnTerminal(t, c)
}

// execOnTerminal: `cairn exec -it JOB/RANK`, run on a terminal (a pty
// standing for the user's), runs the command on a terminal of its own on
// the rank's node, of this one's size; what is typed reaches it (Enter
// as the newline a terminal makes of it), a resize of this terminal
// reaches its terminal, and its exit code is cairn's.
func execOnTerminal(t *testing.T, c *testutil.Cluster) {
	t.Helper()
	master, slave := testutil.Terminal(t, 33, 101)
	cmd := exec.Command(c.Bin, "--data", c.Data, "exec", "-it", "sig/0", "--", "sh", "-c",
		`tty; while [ "$(stty size)" = "0 0" ]; do sleep 0.05; done; stty size; read line; echo "got $line"; stty size; exit 3`)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	var mu sync.Mutex
	var out strings.Builder
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	printed := func(s string) func() (bool, string) {
		return func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			return strings.Contains(out.String(), s), fmt.Sprintf("exec -it printed %q, not yet %q", out.String(), s)
		}
	}
	testutil.WaitUntil(t, 30*time.Second, printed("33 101"))
	if err := pty.SetSize(master, 40, 120); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the resize goes before the line is typed
	if _, err := master.Write([]byte("hello\r")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, 30*time.Second, printed("40 120"))
	if code := exitCode(t, cmd.Wait()); code != 3 {
		t.Errorf("exec -it: exit %d, want 3", code)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{"/dev/pts/", "got hello\r\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("exec -it printed %q, without %q", out.String(), want)
		}
	}
}

// TestJobLaunchLikeSrun: a job's ranks start in the caller's working
// directory with the caller's environment (less its session's), or in
// --workdir; --export picks variables; a volume shows a host directory
// in every rank, read-only if asked; --memory and --cpus limit every rank.
func TestJobLaunchLikeSrun(t *testing.T) {
	c := testutil.NewCluster(t, 2)
	shared := t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "input"), []byte("INPUT\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `echo "cwd=$(pwd) keep=$KEEP_ME ssh=$SSH_CONNECTION"; cat /data/input; ` +
		`echo x > /data/out.$CAIRN_RANK && echo wrote; echo y > /ro/y 2>/dev/null || echo ro-refused; ` +
		`cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null; echo DONE`
	run := func(job string, extra ...string) []string {
		t.Helper()
		args := append([]string{"run", "--job", job, "--ranks", "2", "--volume", shared + ":/data", "--volume", shared + ":/ro:ro",
			"--memory", "256M", "--cpus", "0.5"}, extra...)
		cmd := exec.Command(c.Bin, append(append([]string{"--data", c.Data, "--staging", c.Staging}, args...), "--", "sh", "-c", script)...)
		cmd.Dir = shared
		cmd.Env = append(os.Environ(), "KEEP_ME=kept", "SSH_CONNECTION=1.2.3.4 5 6.7.8.9 22")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("run %s: %v\n%s", job, err, out)
		}
		var outs []string
		for r := range 2 {
			var out string
			testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
				out = c.Logs(job, r)
				return strings.Contains(out, "DONE"), out
			})
			outs = append(outs, out)
		}
		return outs
	}
	for r, out := range run("srun") {
		want := []string{"cwd=" + shared + " keep=kept ssh=\n", "INPUT", "wrote", "ro-refused", "268435456", "50000"}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("rank %d: no %q in:\n%s", r, w, out)
			}
		}
		if _, err := os.Stat(filepath.Join(shared, fmt.Sprintf("out.%d", r))); err != nil {
			t.Errorf("rank %d's result is not in the volume: %v", r, err)
		}
	}
	for r, out := range run("none", "--export", "NONE", "--workdir", "/tmp") {
		if !strings.Contains(out, "cwd=/tmp keep= ssh=\n") {
			t.Errorf("--export NONE --workdir /tmp, rank %d:\n%s", r, out)
		}
	}
}

// completeClusterNames: the shell's completion (cairn __complete) offers
// the cluster's jobs, its nodes where a node is named (an argument, a
// flag, the last of a list) and a job's checkpoints once JOB: is typed.
// Job sig runs, with no checkpoint.
func completeClusterNames(t *testing.T, c *testutil.Cluster) {
	t.Helper()
	complete := func(args ...string) []string {
		t.Helper()
		var names []string
		for _, l := range strings.Split(strings.TrimSpace(c.OK(append([]string{"__complete"}, args...)...)), "\n") {
			if !strings.HasPrefix(l, ":") && !strings.HasPrefix(l, "Completion ended") {
				names = append(names, l)
			}
		}
		return names
	}
	n1, n2 := c.Nodes[0], c.Nodes[1]
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"restart", ""}, []string{"sig"}},
		{[]string{"drain", ""}, []string{n1, n2}},
		{[]string{"node", "spare", n2[:len(n2)-1]}, []string{n1, n2}},
		{[]string{"migrate", "sig/0", "--to", ""}, []string{n1, n2}},
		{[]string{"run", "--nodes", n1 + "," + n2[:len(n2)-1]}, []string{n1 + "," + n1, n1 + "," + n2}},
		{[]string{"restart", "sig", "--placement", ""}, []string{n1, n2}},
	} {
		if got := complete(tc.args...); !slices.Equal(got, tc.want) {
			t.Errorf("complete %q: %q, want %q", tc.args, got, tc.want)
		}
	}
}
