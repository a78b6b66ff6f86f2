package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// cli runs the cairn binary against one test env.
type cli struct {
	t   *testing.T
	bin string
	env *testutil.Env
	dir string // where cairn runs ("": the test's directory)
}

func newCLI(t *testing.T) *cli {
	return &cli{t: t, bin: testutil.CairnBinary(t), env: testutil.NewEnv(t)}
}

// run runs cairn with args and returns stdout, stderr and the exit code.
func (c *cli) run(args ...string) (string, string, int) {
	c.t.Helper()
	full := append([]string{"--data", c.env.DataDir, "--staging", c.env.StagingDir,
		"--bridge", c.env.Bridge.Name, "--subnet", c.env.Bridge.Subnet.String()}, args...)
	cmd := exec.Command(c.bin, full...)
	cmd.Dir = c.dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("cairn %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// ok runs cairn and fails the test unless it exits 0.
func (c *cli) ok(args ...string) string {
	c.t.Helper()
	out, errs, code := c.run(args...)
	if code != 0 {
		c.t.Fatalf("cairn %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

func (c *cli) json(v any, args ...string) {
	c.t.Helper()
	out := c.ok(append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		c.t.Fatalf("cairn %v --json: %v\n%s", args, err, out)
	}
}

func (c *cli) waitLogs(name, substr string) {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if out, _, _ := c.run("logs", name); strings.Contains(out, substr) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("logs of %s never showed %q", name, substr)
}

// TestCLIRunRelativePath: a container started without --rootfs starts in
// the caller's directory, so that `run -- ./prog` runs ./prog there, as a
// job's ranks do; with --workdir it starts there.
func TestCLIRunRelativePath(t *testing.T) {
	c := newCLI(t)
	// On the root file system: the container's lower layer is the host's
	// /, without what is mounted over it (a /tmp on tmpfs).
	dir, err := os.MkdirTemp("/var/tmp", "cairn-rel-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	prog := "#!/bin/sh\necho \"relative ok in $(pwd)\"\nexec sleep 600\n"
	if err := os.WriteFile(filepath.Join(dir, "prog"), []byte(prog), 0o755); err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	c.ok("run", "--name", "rel", "--", "./prog")
	c.waitLogs("rel", "relative ok in "+dir)
	c.dir = ""
	c.ok("run", "--name", "abs", "--workdir", dir, "--", "./prog")
	c.waitLogs("abs", "relative ok in "+dir)
	c.ok("rm", "-f", "rel")
	c.ok("rm", "-f", "abs")
}

// TestCLIPs: a container whose command spans lines stays on one row of
// ps; -q lists names only; --format applies a template to each; they
// exclude each other and --json.
func TestCLIPs(t *testing.T) {
	c := newCLI(t)
	c.ok("run", "--name", "multi", "--", "/bin/sh", "-c", "sleep 600\necho never")
	c.ok("run", "--name", "plain", "--", "/bin/sleep", "600")
	rows := strings.Split(strings.TrimSpace(c.ok("ps")), "\n")
	if len(rows) != 3 || !strings.Contains(strings.Join(rows, "\n"), `/bin/sh -c "sleep 600\necho never"`) {
		t.Errorf("ps: want a header and a row each:\n%s", strings.Join(rows, "\n"))
	}
	if got := strings.Fields(c.ok("ps", "-q")); !slices.Equal(got, []string{"multi", "plain"}) {
		t.Errorf("ps -q: %q", got)
	}
	if got := c.ok("ps", "--format", `{{.Name}}\t{{.Status}}`); got != "multi\trunning\nplain\trunning\n" {
		t.Errorf("ps --format: %q", got)
	}
	for _, args := range [][]string{{"ps", "-q", "--json"}, {"ps", "--format", "{{.Name}}", "-q"}, {"ps", "--format", "{{.Nope"}, {"ps", "--format", "{{.Nope}}"}} {
		if _, errs, code := c.run(args...); code != 2 {
			t.Errorf("cairn %q: exit %d, want 2\n%s", args, code, errs)
		}
	}
	c.ok("rm", "-f", "multi")
	c.ok("rm", "-f", "plain")
}

// TestCLISystemPrune: system prune leaves a bridge a container is
// attached to, and removes it and its guard once none is.
func TestCLISystemPrune(t *testing.T) {
	c := newCLI(t)
	br := c.env.Bridge.Name
	ctx := context.Background()
	c.ok("run", "--name", "p", "--", "/bin/sleep", "600")
	if out := c.ok("system", "prune"); !strings.Contains(out, "in use by 1 container") || !netw.LinkExists(br) {
		t.Errorf("prune with a container on %s: %q", br, out)
	}
	c.ok("rm", "-f", "p")
	if g, err := netw.Guarded(ctx, "", br); err != nil || !g {
		t.Fatalf("before the prune, %s is not guarded: %v %v", br, g, err)
	}
	if out := c.ok("system", "prune"); !strings.Contains(out, "removed bridge "+br) {
		t.Errorf("prune of an unused bridge: %q", out)
	}
	if g, err := netw.Guarded(ctx, "", br); err != nil || g || netw.LinkExists(br) {
		t.Errorf("after the prune: bridge %s exists %v, guarded %v (%v)", br, netw.LinkExists(br), g, err)
	}
	if out := c.ok("system", "prune"); !strings.Contains(out, "nothing to remove") {
		t.Errorf("prune again: %q", out)
	}
	c.ok("run", "--name", "again", "--", "/bin/sleep", "600") // the bridge comes back
	c.ok("rm", "-f", "again")
}

// TestCLILogsTail: --tail N prints the last N lines of a container's
// output, with -f too (then what comes); N must be at least 1.
func TestCLILogsTail(t *testing.T) {
	c := newCLI(t)
	c.ok("run", "--name", "count", "--", "/bin/sh", "-c", "seq 1 10; printf partial")
	c.ok("wait", "count")
	if out := c.ok("logs", "--tail", "3", "count"); out != "9\n10\npartial" {
		t.Errorf("logs --tail 3: %q", out)
	}
	if out := c.ok("logs", "-f", "--tail", "2", "count"); out != "10\npartial" {
		t.Errorf("logs -f --tail 2 of an ended container: %q", out)
	}
	if out := c.ok("logs", "count"); !strings.HasPrefix(out, "1\n2\n") {
		t.Errorf("logs without --tail: %q", out)
	}
	if _, errs, code := c.run("logs", "--tail", "-1", "count"); code != 2 {
		t.Errorf("logs --tail -1: exit %d\n%s", code, errs)
	}
}

// TestCLICompletion: the shell's completion (cairn __complete) offers the
// containers of this node for a NAME, and their checkpoints for a
// NAME:SEQ once NAME: is typed.
func TestCLICompletion(t *testing.T) {
	c := newCLI(t)
	c.ok("run", "--name", "alpha", "--", "/bin/sleep", "600")
	c.ok("run", "--name", "beta", "--", "/bin/sleep", "600")
	c.ok("checkpoint", "alpha")
	complete := func(args ...string) []string {
		t.Helper()
		out := c.ok(append([]string{"__complete"}, args...)...)
		var names []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if !strings.HasPrefix(l, ":") {
				names = append(names, l)
			}
		}
		return names
	}
	if got := complete("logs", ""); !slices.Equal(got, []string{"alpha", "beta"}) {
		t.Errorf("complete logs: %q", got)
	}
	if got := complete("kill", "b"); !slices.Equal(got, []string{"beta"}) {
		t.Errorf("complete kill b: %q", got)
	}
	if got := complete("rm", "alpha", ""); !slices.Equal(got, []string{"alpha", "beta"}) {
		t.Errorf("complete rm alpha ...: %q", got)
	}
	if got := complete("restore", "al"); !slices.Equal(got, []string{"alpha:"}) {
		t.Errorf("complete restore al: %q", got)
	}
	if got := complete("restore", "alpha:"); !slices.Equal(got, []string{"alpha:1"}) {
		t.Errorf("complete restore alpha: %q", got)
	}
	c.ok("rm", "-f", "alpha", "beta")
}

// TestCLICheckpointInterrupted: Ctrl-C during a container's checkpoint
// (SIGINT to cairn's process group, as a terminal sends it) lets the dump
// finish, for CRIU killed in the middle leaves its code in the
// processes (it used to: "CRIU's parasite is still in pid ..."), then
// abandons the checkpoint: exit 130 saying so and what state the
// container is in, read afresh; the container runs on, and no checkpoint
// is listed.
func TestCLICheckpointInterrupted(t *testing.T) {
	c := newCLI(t)
	c.ok("run", "--name", "big", "--", c.bin, "stateapp", "-no-stream", "-mem", "384", "-dirty-every", "0", "-dir", "/var/lib/stateapp")
	time.Sleep(3 * time.Second) // its memory written
	cmd := exec.Command(c.bin, "--data", c.env.DataDir, "--staging", c.env.StagingDir,
		"--bridge", c.env.Bridge.Name, "--subnet", c.env.Bridge.Subnet.String(), "checkpoint", "big")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 || !strings.Contains(errb.String(), "the dump finishes first") ||
		!strings.Contains(errb.String(), "interrupted: the checkpoint of big was abandoned and nothing of it kept; big is running") || strings.Contains(errb.String(), "parasite") {
		t.Fatalf("checkpoint interrupted: %v, want exit 130 saying it was abandoned and big runs on:\n%s", err, errb.String())
	}
	t.Logf("interrupted: %s", strings.TrimSpace(errb.String()))
	var in container.Info
	c.json(&in, "inspect", "big")
	if in.Status != container.StatusRunning {
		t.Errorf("after the interrupted checkpoint, big is %s", in.Status)
	}
	var recs []image.Record
	c.json(&recs, "checkpoints", "big")
	if len(recs) != 0 {
		t.Errorf("the interrupted checkpoint is listed: %+v", recs)
	}
	c.ok("checkpoint", "big") // and it can be checkpointed
	c.ok("rm", "-f", "big")
}

// TestCLIHintsCarryData: a hint to run cairn again names the data dir
// this call was given, or the user runs it on another one.
func TestCLIHintsCarryData(t *testing.T) {
	bin := testutil.CairnBinary(t)
	data := filepath.Join(t.TempDir(), "my data")
	cmd := exec.Command(bin, "--data", data, "jobs")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "CAIRN_COORDINATOR=") || strings.HasPrefix(kv, "CAIRN_DATA=")
	})
	out, err := cmd.CombinedOutput()
	if want := "`cairn --data '" + data + "' up`"; err == nil || !strings.Contains(string(out), want) {
		t.Errorf("cairn --data %q jobs without a cluster: %v, want a hint %s:\n%s", data, err, want, out)
	}
}

// TestCLIRunExitsAtOnce: a program that ends before run returns is
// reported as ended, with its code, never as "running (pid 0)"; a
// failing one makes run fail.
func TestCLIRunExitsAtOnce(t *testing.T) {
	c := newCLI(t)
	for _, tc := range []struct {
		name, script string
		code         int
		say          string
	}{
		{"ok", "exit 0", 0, "ok exited (0) at once; its output: cairn --data " + c.env.DataDir + " logs ok"},
		{"bad", "echo no config >&2; exit 3", 1, "bad exited (3) at once"},
	} {
		out, errs, code := c.run("run", "--name", tc.name, "--", "/bin/sh", "-c", tc.script)
		if code != tc.code || !strings.Contains(out+errs, tc.say) || strings.Contains(out, "running") {
			t.Errorf("run of a program that does %q: exit %d, want %d saying %q\nstdout: %s\nstderr: %s", tc.script, code, tc.code, tc.say, out, errs)
		}
	}
	if out := c.ok("logs", "bad"); !strings.Contains(out, "no config") {
		t.Errorf("logs of the program that failed at once: %q", out)
	}
}

// TestCLILifecycle drives every command through a container's life, each
// call a new cairn process: state lives in the data dir, not in memory.
func TestCLILifecycle(t *testing.T) {
	c := newCLI(t)
	out := c.ok("run", "--name", "job", "--env", "GREETING=hi", "--", c.bin, "stateapp", "-dir", "/var/lib/stateapp")
	if !strings.Contains(out, "job running") {
		t.Fatalf("run output %q", out)
	}
	var list []container.Info
	c.json(&list, "ps")
	if len(list) != 1 || list[0].Name != "job" || list[0].Status != "running" || !list[0].Addr.IsValid() {
		t.Fatalf("ps --json: %+v", list)
	}
	var in container.Info
	c.json(&in, "inspect", "job")
	if in.Endpoint.Netns == "" || in.Config.Env[0] != "GREETING=hi" {
		t.Fatalf("inspect --json: %+v", in)
	}
	if out := c.ok("exec", "job", "--", "sh", "-c", "echo $GREETING from $(hostname)"); strings.TrimSpace(out) != "hi from job" {
		t.Fatalf("exec output %q", out)
	}
	if _, _, code := c.run("exec", "job", "--", "sh", "-c", "exit 7"); code != 7 {
		t.Fatalf("exec exit code %d, want 7", code)
	}
	// cairn's own failures, apart from the command's codes (podman's).
	for _, tc := range []struct {
		args []string
		code int
		say  string
	}{
		{[]string{"exec", "job", "--", "no-such-command"}, 127, "no no-such-command in $PATH"},
		{[]string{"exec", "job", "--", "./no-such-file"}, 127, "no file ./no-such-file"},
		{[]string{"exec", "job", "--", "/etc/passwd"}, 126, "not an executable file"},
		{[]string{"exec", "ghost", "--", "true"}, 125, "ghost"},
		{[]string{"exec", "job"}, 125, "arg"},
		{[]string{"wait", "ghost"}, 125, "ghost"},
	} {
		_, errs, code := c.run(tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.say) || strings.Contains(errs, "exec failed") {
			t.Errorf("cairn %q: exit %d, want %d saying %q (and no runc log line):\n%s", tc.args, code, tc.code, tc.say, errs)
		}
	}
	c.waitLogs("job", "recv=")

	var man image.Record
	c.json(&man, "checkpoint", "job")
	if man.Name() != "job:1" || man.Timing.Stall <= 0 {
		t.Fatalf("checkpoint --json: %+v", man)
	}
	c.ok("checkpoint", "job")
	var mans []image.Record
	c.json(&mans, "checkpoints", "job")
	if len(mans) != 2 {
		t.Fatalf("checkpoints: %d", len(mans))
	}
	if out := c.ok("checkpoints"); !strings.Contains(out, "job:1") || !strings.Contains(out, "job:2") {
		t.Fatalf("checkpoints table:\n%s", out)
	}
	if out := c.ok("verify", "--all", "--read-data"); strings.Count(out, "ok   job:") != 2 || !strings.Contains(out, "ok   store:") {
		t.Fatalf("verify --all:\n%s", out)
	}

	c.ok("kill", "job")
	c.json(&in, "inspect", "job")
	if in.Status != "exited" || in.Exit == nil || in.Exit.Signal != "SIGKILL" {
		t.Fatalf("after kill: %+v", in)
	}
	killed := c.ok("logs", "job")
	if out := c.ok("restore", "job", "--from", "1"); !strings.Contains(out, "restored from job:1") {
		t.Fatalf("restore output %q", out)
	}
	// The restored log starts with checkpoint 1's output; the killed run's
	// whole log is incarnation 1's.
	var incs []agentv1.Incarnation
	c.json(&incs, "logs", "job", "--incarnations")
	if len(incs) != 2 || incs[0].N != 1 || incs[0].Signal != "SIGKILL" || !incs[1].Current || incs[1].RestoredFrom != "job:1" ||
		incs[1].Restored <= 0 || incs[1].Restored >= int64(len(killed)) {
		t.Fatalf("logs --incarnations after the restore: %+v (the killed run printed %d bytes)", incs, len(killed))
	}
	if got := c.ok("logs", "job", "--incarnation", "1"); got != killed {
		t.Fatalf("logs --incarnation 1: %d bytes, the killed run printed %d", len(got), len(killed))
	}
	if got := c.ok("logs", "job"); !strings.HasPrefix(got, killed[:incs[1].Restored]) {
		t.Fatalf("the restored log does not start with checkpoint 1's output")
	}
	if out := c.ok("logs", "job", "--incarnations"); !strings.Contains(out, "2 (current)") || !strings.Contains(out, "job:1") {
		t.Fatalf("logs --incarnations:\n%s", out)
	}
	// A second restore beside it.
	c.ok("restore", "job", "--from", "job:2", "--as", "copy")
	c.json(&list, "ps")
	if len(list) != 2 || list[0].Status != "running" || list[1].Status != "running" {
		t.Fatalf("ps after restores: %+v", list)
	}

	// rm keeps checkpoints; restore recreates a removed container.
	c.ok("rm", "-f", "job", "copy")
	c.json(&list, "ps")
	if len(list) != 0 {
		t.Fatalf("ps after rm: %+v", list)
	}
	c.ok("restore", "job")
	c.json(&in, "inspect", "job")
	if in.Status != "running" || in.RestoredFrom != "job:2" {
		t.Fatalf("restore after rm: %+v", in)
	}
	c.ok("checkpoint", "rm", "job:1")
	c.json(&mans, "checkpoints", "job")
	if len(mans) != 1 || mans[0].Seq != 2 {
		t.Fatalf("after checkpoint rm: %+v", mans)
	}
	c.ok("rm", "-f", "job")
}

// TestCLIErrors checks that mistakes get a clear message and the
// documented exit code, and change nothing.
func TestCLIErrors(t *testing.T) {
	c := newCLI(t)
	tests := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"checkpoint", "ghost"}, 3, "no container ghost; containers here: none"},
		{[]string{"restore", "ghost"}, 3, "has no checkpoint"},
		{[]string{"inspect", "ghost"}, 3, "no such container"},
		{[]string{"run", "--", "true"}, 2, "--name (a container) or --job"},
		{[]string{"run", "--name", "x"}, 2, "no command given"},
		{[]string{"run", "--name", "../x", "--", "true"}, 2, "invalid container name"},
		{[]string{"run", "--name", "x", "--checkpoint-every", "5m", "--", "true"}, 2, "--checkpoint-every does not apply to a container"},
		{[]string{"run", "--name", "x", "--ranks", "2", "--replicas", "2", "--", "true"}, 2, "--ranks, --replicas does not apply"},
		{[]string{"run", "--job", "j", "--hostname", "h", "--", "true"}, 2, "--hostname does not apply to a job"},
		{[]string{"ps", "--no-such-flag"}, 2, "unknown flag"},
		{[]string{"restore", "x", "--from", "abc"}, 2, "bad checkpoint"},
		{[]string{"verify"}, 2, "--all"},
		{[]string{"kill", "-s", "NOPE", "x"}, 2, "unknown signal"},
		{[]string{"logs", "-f", "--incarnation", "1", "x"}, 2, "-f follows the current incarnation"},
		{[]string{"logs", "--incarnations", "ghost"}, 3, "no container ghost"},
	}
	for _, tc := range tests {
		_, errs, code := c.run(tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.msg) {
			t.Errorf("cairn %s: exit %d, stderr %q; want exit %d with %q", strings.Join(tc.args, " "), code, errs, tc.code, tc.msg)
		}
	}

	c.ok("run", "--name", "a", "--", c.bin, "stateapp", "-no-stream", "-dir", "/var/lib/stateapp")
	c.ok("run", "--name", "solver", "--", "/bin/sleep", "600")
	for _, args := range [][]string{{"logs", "solvr"}, {"kill", "slover"}, {"checkpoint", "solve"}, {"rm", "-f", "solverr"}} {
		if _, errs, code := c.run(args...); code != 3 || !strings.Contains(errs, "; did you mean solver?; containers here: a, solver") {
			t.Errorf("cairn %q, a slip of solver's name: exit %d %q; want 3 naming solver and what exists", args, code, errs)
		}
	}
	c.ok("rm", "-f", "solver")
	if _, errs, code := c.run("run", "--name", "a", "--", "true"); code != 1 || !strings.Contains(errs, "already exists") {
		t.Errorf("duplicate run: exit %d %q", code, errs)
	}
	if _, errs, code := c.run("rm", "a"); code != 1 || !strings.Contains(errs, "--force") {
		t.Errorf("rm of running container: exit %d %q", code, errs)
	}
	c.waitLogs("a", "count=50")
	c.ok("checkpoint", "a", "--stop")
	if _, errs, code := c.run("checkpoint", "a"); code != 1 || !strings.Contains(errs, "not running") {
		t.Errorf("checkpoint of a stopped container: exit %d %q", code, errs)
	}

	// A corrupt checkpoint: exit 4, the image named, verify says BAD.
	packs, _ := filepath.Glob(filepath.Join(c.env.DataDir, "store", "packs", "*", "*"))
	if len(packs) == 0 {
		t.Fatal("no pack in the store")
	}
	for _, p := range packs {
		if err := os.Truncate(p, 100); err != nil {
			t.Fatal(err)
		}
	}
	if _, errs, code := c.run("restore", "a"); code != 4 || !strings.Contains(errs, "corrupt") {
		t.Errorf("restore of truncated image: exit %d %q", code, errs)
	}
	if out, _, code := c.run("verify", "a", "--read-data"); code != 4 || !strings.Contains(out, "BAD  a:1") {
		t.Errorf("verify of truncated image: exit %d %q", code, out)
	}
	if out, _, code := c.run("verify", "--all"); code != 4 || !strings.Contains(out, "BAD  store: pack") {
		t.Errorf("verify --all of a store with truncated packs: exit %d %q", code, out)
	}

	// An old CRIU is refused with the reason and the remedy: exit 5.
	fake := filepath.Join(t.TempDir(), "criu")
	os.WriteFile(fake, []byte("#!/bin/sh\necho 'Version: 3.17.1'\n"), 0o755)
	if _, errs, code := c.run("--criu", fake, "restore", "a"); code != 5 || !strings.Contains(errs, "needs 4.2.0 or newer") {
		t.Errorf("restore with CRIU 3.17: exit %d %q", code, errs)
	}
}

// tree lists every path under dir with its size, for before/after
// comparisons.
func tree(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			out[p] = fi.Size()
		}
		return nil
	})
	return out
}

// TestCLIHostileNames gives every command that takes a container name
// names that would escape the data dir or cannot exist: each is a usage
// error (exit 2) and nothing is created, inside the data dir or beside it.
// A valid name that does not exist leaves no lock file behind.
func TestCLIHostileNames(t *testing.T) {
	c := newCLI(t)
	parent := filepath.Dir(c.env.DataDir)
	c.ok("ps") // the data dir's skeleton exists before the comparison
	before, beside := tree(t, c.env.DataDir), tree(t, parent)
	out := filepath.Join(t.TempDir(), "out.cairn")
	for _, name := range []string{"../../x", "../x", "/abs", "..", ".", "-x", "x\ny", strings.Repeat("a", 64)} {
		for _, args := range [][]string{
			{"checkpoint", name}, {"restore", name}, {"restore", "x", "--as", name}, {"inspect", name},
			{"kill", name}, {"rm", name}, {"rm", "-f", name}, {"wait", name}, {"exec", name, "--", "true"},
			{"checkpoints", name}, {"verify", name}, {"export", name + ":1", "-o", out},
			{"checkpoint", "pin", name + ":1"}, {"checkpoint", "rm", name + ":1"},
			{"run", "--name", name, "--", "true"}, {"logs", name},
		} {
			if strings.HasPrefix(name, "-") {
				args = append(args[:len(args)-1:len(args)-1], "--", name) // a name, not a flag
				if args[0] == "run" || args[0] == "exec" || args[0] == "export" || args[0] == "restore" {
					continue
				}
			}
			want := 2 // usage
			if args[0] == "wait" || args[0] == "exec" {
				want = 125 // cairn's own failure where the child's code is the exit code
			}
			_, errs, code := c.run(args...)
			if code != want {
				t.Errorf("cairn %q: exit %d, want %d\n%s", args, code, want, errs)
			}
		}
	}
	for _, args := range [][]string{{"checkpoint", "ghost"}, {"restore", "ghost"}, {"rm", "ghost"}, {"kill", "ghost"}} {
		if _, errs, code := c.run(args...); code != 3 {
			t.Errorf("cairn %q: exit %d, want 3 (not found)\n%s", args, code, errs)
		}
	}
	after, besideAfter := tree(t, c.env.DataDir), tree(t, parent)
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("created in the data dir: %s", p)
		}
	}
	for p := range besideAfter {
		if _, ok := beside[p]; !ok && !strings.HasPrefix(p, c.env.DataDir) && !strings.HasPrefix(p, filepath.Dir(out)) {
			t.Errorf("created beside the data dir: %s", p)
		}
	}
}

// TestCLIHelp: every command answers --help; version says which API.
func TestCLIHelp(t *testing.T) {
	bin := testutil.CairnBinary(t)
	if out, err := exec.Command(bin, "version", "--json").Output(); err != nil || !strings.Contains(string(out), `"api": "v1"`) {
		t.Errorf("cairn version --json: %v\n%s", err, out)
	}
	for _, cmd := range newRootCmd().Commands() {
		if cmd.Hidden {
			continue
		}
		out, err := exec.Command(bin, cmd.Name(), "--help").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Usage:") {
			t.Errorf("cairn %s --help: %v\n%s", cmd.Name(), err, out)
		}
	}
}

// TestCLIStoreLifecycle: pin, gc with retention, du, export and import.
func TestCLIStoreLifecycle(t *testing.T) {
	c := newCLI(t)
	// 10% of its memory rewritten between checkpoints, on SIGUSR1: what
	// each checkpoint adds does not depend on how fast this machine is.
	c.ok("run", "--name", "s", "--", c.bin, "stateapp", "-no-stream", "-mem", "8", "-dirty-every", "0", "-dir", "/var/lib/stateapp")
	c.waitLogs("s", "ready")
	for i := range 4 {
		c.ok("checkpoint", "s")
		if i < 3 {
			c.ok("kill", "-s", "USR1", "s")
			testutil.WaitUntil(t, 20*time.Second, func() (bool, string) {
				out, _, _ := c.run("logs", "s")
				return strings.Count(out, "dirtied pages=") > i, "no rewrite logged after SIGUSR1"
			})
		}
	}
	c.ok("checkpoint", "pin", "s:1")
	if out := c.ok("gc", "--keep", "2", "--dry-run"); strings.TrimSpace(out) != "would remove s:2" {
		t.Fatalf("gc --dry-run:\n%s", out)
	}
	var res struct {
		Removed []string
		Kept    []string
	}
	c.json(&res, "gc", "--keep", "2")
	if strings.Join(res.Removed, ",") != "s:2" || strings.Join(res.Kept, ",") != "s:1,s:3,s:4" {
		t.Fatalf("gc --keep 2: %+v", res)
	}
	var du struct {
		Checkpoints []struct {
			Checkpoint string
			Logical    int64 `json:"logical_bytes"`
			Unique     int64 `json:"unique_bytes"`
		}
		DedupRatio float64 `json:"dedup_ratio"`
	}
	c.json(&du, "du")
	if len(du.Checkpoints) != 3 || du.DedupRatio < 1.5 || du.Checkpoints[1].Unique >= du.Checkpoints[1].Logical/2 {
		t.Fatalf("du: %+v", du)
	}
	if out := c.ok("verify", "--all", "--read-data"); strings.Count(out, "ok   s:") != 3 || !strings.Contains(out, "ok   store:") {
		t.Fatalf("verify after gc:\n%s", out)
	}
	c.ok("kill", "s")
	c.ok("restore", "s", "--from", "1") // pinned: survived gc

	// Export, drop, gc, import under another name, restore.
	file := filepath.Join(t.TempDir(), "s4.cairn")
	var ex exported
	c.json(&ex, "export", "s:4", "-o", file)
	if fi, err := os.Stat(file); err != nil || ex.Checkpoint != "s:4" || ex.File != file || ex.Bytes != fi.Size() || ex.Logical <= 0 {
		t.Fatalf("export --json: %+v (%v)", ex, err)
	}
	c.ok("checkpoint", "rm", "s:4")
	c.ok("gc", "--keep", "1")
	var rec image.Record
	c.json(&rec, "import", file, "--as", "imported")
	if rec.Name() != "imported:1" {
		t.Fatalf("import: %+v", rec)
	}
	c.ok("restore", "imported")
	var in container.Info
	c.json(&in, "inspect", "imported")
	if in.Status != "running" {
		t.Fatalf("imported checkpoint restored as %s", in.Status)
	}

	// A damaged export file is refused and nothing is listed.
	b, _ := os.ReadFile(file)
	b[len(b)/2] ^= 0x10
	bad := filepath.Join(t.TempDir(), "bad.cairn")
	os.WriteFile(bad, b, 0o600)
	if _, errs, code := c.run("import", bad, "--as", "broken"); code != 4 || !strings.Contains(errs, "corrupt") {
		t.Errorf("import of a damaged file: exit %d %q", code, errs)
	}
	var recs []image.Record
	c.json(&recs, "checkpoints", "broken")
	if len(recs) != 0 {
		t.Errorf("damaged import listed: %+v", recs)
	}
}

// TestCLICheckpointKilled SIGKILLs `cairn checkpoint` at 20 seeded random
// moments (freeze, dump, ingest, record): each time, without any other
// cairn command, the container is thawed within a bound (its shim is its
// watchdog) and its network is not left locked by CRIU; afterwards the
// store opens, verify --all --read-data passes, no partial checkpoint is
// listed, and the listed ones restore. Half of the kills aim at the
// window in which a checkpoint keeps the container frozen, and at least
// one must land there (the window the test is about). CAIRN_SOAK=1 runs
// many more rounds.
func TestCLICheckpointKilled(t *testing.T) {
	rounds := 20
	if os.Getenv("CAIRN_SOAK") != "" {
		rounds = 100
	}
	const bound = 10 * time.Second
	c := newCLI(t)
	c.ok("run", "--name", "k", "--", c.bin, "stateapp", "-no-stream", "-mem", "48", "-dirty-every", "100ms", "-dir", "/var/lib/stateapp")
	c.waitLogs("k", "ready")
	var in container.Info
	c.json(&in, "inspect", "k")
	freezer := "/sys/fs/cgroup/freezer" + in.CgroupsPath + "/freezer.state"
	// A checkpoint let run, timed, and when the container is frozen in
	// it (polled): half of the kills aim at that window.
	var frozenFrom, frozenTo time.Duration
	start := time.Now()
	watched, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-ended:
				return
			default:
			}
			if fz, _ := os.ReadFile(freezer); strings.TrimSpace(string(fz)) != "THAWED" {
				if frozenFrom == 0 {
					frozenFrom = time.Since(start)
				}
				frozenTo = time.Since(start)
			} else if frozenTo > 0 {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	c.ok("checkpoint", "k")
	typical := time.Since(start)
	close(ended)
	<-watched
	if frozenTo == 0 {
		t.Fatalf("the container was never seen frozen during a checkpoint of %v", typical)
	}
	t.Logf("a checkpoint takes %v, the container frozen from %v to %v", typical, frozenFrom, frozenTo)
	criuLocked := func() bool { // a CRIU lock table left in the container's netns
		f, err := os.Open(netw.NetnsPath(in.Endpoint.Netns))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		nft, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
		if err != nil {
			t.Fatal(err)
		}
		tables, err := nft.ListTables()
		if err != nil {
			t.Fatal(err)
		}
		for _, tb := range tables {
			if strings.HasPrefix(tb.Name, "CRIU") {
				return true
			}
		}
		return false
	}
	rng := rand.New(rand.NewPCG(1, 2))
	frozenKills := 0 // kills that landed while the container was frozen
	for i := range rounds {
		cmd := exec.Command(c.bin, "--data", c.env.DataDir, "--staging", c.env.StagingDir,
			"--bridge", c.env.Bridge.Name, "--subnet", c.env.Bridge.Subnet.String(), "checkpoint", "k")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		delay := time.Duration(rng.Int64N(int64(typical * 3 / 2)))
		if i%2 == 0 {
			delay = frozenFrom + time.Duration(rng.Int64N(int64(frozenTo-frozenFrom)+1))
		}
		time.Sleep(delay)
		fz, _ := os.ReadFile(freezer)
		cmd.Process.Kill()
		cmd.Wait()
		if strings.TrimSpace(string(fz)) != "THAWED" {
			frozenKills++
		}
		// The container must come back by itself once any orphaned CRIU
		// is done: nothing of cairn runs until it has.
		killed := time.Now()
		for {
			fz, _ := os.ReadFile(freezer)
			locked := criuLocked()
			if strings.TrimSpace(string(fz)) == "THAWED" && !locked {
				break
			}
			if time.Since(killed) > bound {
				marker, _ := os.ReadFile(filepath.Join(in.Dir, "frozen-by"))
				wd, _ := os.ReadFile(filepath.Join(in.Dir, "watchdog.log"))
				ps, _ := exec.Command("sh", "-c", "ps -eo pid,ppid,stat,args | grep -E 'criu|runc' | grep -v grep").CombinedOutput()
				t.Fatalf("round %d (killed after %v): freezer %q, CRIU lock %v after %v; note %q; watchdog %q; ps:\n%s", i, delay, fz, locked, bound, marker, wd, ps)
			}
			time.Sleep(20 * time.Millisecond)
		}
		c.json(&in, "inspect", "k")
		if in.Status != "running" {
			t.Fatalf("round %d: container %s after the kill", i, in.Status)
		}
	}
	var recs []image.Record
	c.json(&recs, "checkpoints", "k")
	t.Logf("%d of %d killed checkpoints completed; %d kills landed while the container was frozen", len(recs)-1, rounds, frozenKills)
	if frozenKills == 0 {
		t.Errorf("no kill of %d landed while the container was frozen: the test missed the window it is about", rounds)
	}
	if out, errs, code := c.run("verify", "--all", "--read-data"); code != 0 || strings.Contains(out, "BAD") {
		t.Fatalf("verify after kills: exit %d\n%s%s", code, out, errs)
	}
	for _, r := range []image.Record{recs[0], recs[len(recs)-1]} {
		name := fmt.Sprintf("copy%d", r.Seq)
		c.ok("restore", "k", "--from", fmt.Sprint(r.Seq), "--as", name)
		c.ok("rm", "-f", name)
	}
	if ents, _ := os.ReadDir(c.env.StagingDir); len(ents) != 0 {
		// Staging of killed checkpoints is removed by the next one.
		c.ok("checkpoint", "k")
		if ents, _ := os.ReadDir(c.env.StagingDir); len(ents) != 0 {
			t.Errorf("staging left behind: %v", ents)
		}
	}
}

// TestCLIPKI: init makes a CA once; node cert issues credentials; mistakes
// are refused clearly.
func TestCLIPKI(t *testing.T) {
	c := newCLI(t)
	if _, errs, code := c.run("node", "cert", "n1", "-o", t.TempDir()); code != 1 || !strings.Contains(errs, "run `cairn --data "+c.env.DataDir+" init` first") {
		t.Errorf("cert before init: exit %d %q", code, errs)
	}
	if out := c.ok("init"); !strings.Contains(out, "cluster ") {
		t.Fatalf("init: %q", out)
	}
	if _, errs, code := c.run("init"); code != 1 || !strings.Contains(errs, "--force") {
		t.Errorf("second init: exit %d %q", code, errs)
	}
	dir := t.TempDir()
	if out := c.ok("node", "cert", "n1", "-o", dir, "--ip", "10.214.0.5"); !strings.Contains(out, "agent n1") {
		t.Fatalf("node cert: %q", out)
	}
	for _, f := range []string{"node.crt", "node.key", "ca.crt"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "node.key" && fi.Mode().Perm() != 0o600 {
			t.Errorf("node.key mode %v", fi.Mode().Perm())
		}
	}
	// --renew keeps the name, role and address; --json says what it wrote.
	var got struct {
		Name    string `json:"name"`
		Role    string `json:"role"`
		Dir     string `json:"dir"`
		Renewed bool   `json:"renewed"`
	}
	before, _ := os.ReadFile(filepath.Join(dir, "node.crt"))
	if err := json.Unmarshal([]byte(c.ok("node", "cert", "--renew", "-o", dir, "--json")), &got); err != nil || got.Name != "n1" || got.Role != "agent" || got.Dir != dir || !got.Renewed {
		t.Errorf("node cert --renew --json: %+v %v", got, err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "node.crt"))
	if bytes.Equal(before, after) {
		t.Error("node cert --renew left node.crt as it was")
	}
	if out, err := exec.Command("openssl", "x509", "-in", filepath.Join(dir, "node.crt"), "-noout", "-ext", "subjectAltName").CombinedOutput(); err != nil || !strings.Contains(string(out), "IP Address:10.214.0.5") {
		t.Errorf("renewed certificate's SANs: %v %s", err, out)
	}
	for _, args := range [][]string{
		{"node", "cert", "--renew", "-o", dir, "--ip", "10.0.0.9"},
		{"node", "cert", "n2", "--renew", "-o", dir},
		{"node", "cert", "../evil", "-o", dir},
		{"node", "cert", "n2", "-o", dir, "--role", "root"},
		{"node", "cert", "n2", "-o", dir, "--ip", "not-an-ip"},
		{"node", "cert", "n2"},
	} {
		if _, errs, code := c.run(args...); code != 2 {
			t.Errorf("cairn %v: exit %d %q, want 2", args, code, errs)
		}
	}
}

// TestCLIInsideNodeNamespace runs cairn inside a network namespace playing
// a node (as agents of a local cluster will run): the node's bridge and the
// containers' namespaces live there, and checkpoint, kill and restore keep
// the TCP stream going.
func TestCLIInsideNodeNamespace(t *testing.T) {
	c := newCLI(t)
	node := "cn" + c.env.Bridge.Name[2:] // unique per test
	if out, err := exec.Command("ip", "netns", "add", node).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() {
		// The containers go first (the env's teardown, registered earlier,
		// runs after this), so remove them from inside the node here.
		exec.Command("nsenter", "--net=/run/netns/"+node, c.bin, "--data", c.env.DataDir, "--staging", c.env.StagingDir,
			"--bridge", c.env.Bridge.Name, "--subnet", c.env.Bridge.Subnet.String(), "rm", "-f", "n").Run()
		exec.Command("ip", "netns", "del", node).Run()
	})
	exec.Command("ip", "-n", node, "link", "set", "lo", "up").Run()
	in := func(args ...string) string {
		t.Helper()
		full := append([]string{"--net=/run/netns/" + node, c.bin, "--data", c.env.DataDir, "--staging", c.env.StagingDir,
			"--bridge", c.env.Bridge.Name, "--subnet", c.env.Bridge.Subnet.String()}, args...)
		out, err := exec.Command("nsenter", full...).CombinedOutput()
		if err != nil {
			t.Fatalf("cairn %v in node: %v\n%s", args, err, out)
		}
		return string(out)
	}
	in("run", "--name", "n", "--", c.bin, "stateapp", "-dir", "/var/lib/stateapp")
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(in("logs", "n"), "recv=") {
		if time.Now().After(deadline) {
			t.Fatal("no stream")
		}
		time.Sleep(100 * time.Millisecond)
	}
	in("checkpoint", "n")
	in("kill", "n")
	before := len(in("logs", "n"))
	in("restore", "n")
	for {
		logs := in("logs", "n")
		if after := logs[min(before, len(logs)):]; strings.Count(after, "recv=") >= 3 {
			if strings.Contains(after, "FAIL") {
				t.Fatalf("stream failed after restore:\n%s", after)
			}
			break
		}
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatal("the stream did not go on after restore")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The node bridge is inside the node, not on the host.
	if out, _ := exec.Command("ip", "-o", "link", "show", "dev", c.env.Bridge.Name).CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Errorf("the node's bridge appeared on the host: %s", out)
	}
	in("rm", "-f", "n")
}
