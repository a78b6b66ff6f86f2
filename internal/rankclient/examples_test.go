package rankclient_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/rankclient/ranktest"
)

// The programs of examples/rank-api against the fake endpoint: the same
// final checksums as alone, whatever the rounds end in.

func example(t *testing.T, name string) string {
	return filepath.Join(repo(t), "examples", "rank-api", name)
}

// pythonCmd runs a Python program with the module of deploy/python.
func pythonCmd(t *testing.T, args ...string) *exec.Cmd {
	need(t, "python3")
	cmd := exec.Command("python3", args...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repo(t), "deploy", "python"), "PYTHONDONTWRITEBYTECODE=1")
	return cmd
}

// output runs cmd with $CAIRN_SOCKET set to socket, and returns its output.
func output(t *testing.T, cmd *exec.Cmd, socket string, env ...string) string {
	t.Helper()
	cmd.Env = append(append(cmd.Environ(), "CAIRN_SOCKET="+socket), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	return string(out)
}

var finalRE = regexp.MustCompile(`(?m)^rank \d+: FINAL .*$`)

// final is the FINAL line of out.
func final(t *testing.T, out string) string {
	t.Helper()
	f := finalRE.FindString(out)
	if f == "" {
		t.Fatalf("no FINAL line in:\n%s", out)
	}
	return f
}

func has(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("no %q in:\n%s", w, out)
		}
	}
}

// ckptExample runs a ckpt program as rank 2 without a checkpoint, then
// with a checkpoint done, then with one it is restored from, and alone.
func ckptExample(t *testing.T, cmd func(args ...string) *exec.Cmd) {
	args := func(at string) []string {
		return []string{"--steps", "300", "--checkpoint-at", at, "--every", "100", "--sleep-ms", "0", "--asker", "2"}
	}
	newServer := func() *ranktest.Server {
		return ranktest.New(t, ranktest.Config{Dir: socketDir(t), Job: "ck", Rank: 2, Size: 4, Ckpt: 7, Pending: 20 * time.Millisecond, Frozen: 50 * time.Millisecond})
	}
	s := newServer()
	plain := output(t, cmd(args("0")...), s.Path())
	has(t, plain, "rank 2 of 4, job ck, incarnation 1", "rank 2: steps 201-300 done")
	if tr := s.Trace(); len(tr) != 0 {
		t.Fatalf("a round without asking: %v", tr)
	}
	for _, tc := range []struct {
		outcome ranktest.Outcome
		says    string
	}{
		{ranktest.Done, "rank 2: checkpoint 8 done at step 120"},
		{ranktest.Restored, "rank 2: restored from checkpoint 8, at step 120"},
	} {
		s := newServer()
		s.Next(tc.outcome)
		out := output(t, cmd(args("120")...), s.Path())
		has(t, out, tc.says, "rank 2: steps 201-300 done")
		if got, want := final(t, out), final(t, plain); got != want {
			t.Errorf("after a round %s: %s; without one: %s", tc.outcome, got, want)
		}
	}
	alone := output(t, cmd(args("120")...), filepath.Join(t.TempDir(), "none", "rank.sock"))
	has(t, alone, "rank 0: not in a cairn rank", "rank 0: steps 201-300 done")
	if a, p := final(t, alone), final(t, plain); strings.TrimPrefix(a, "rank 0") == strings.TrimPrefix(p, "rank 2") {
		t.Errorf("rank 0 and rank 2 end with the same checksum: %s", a)
	}
}

func TestRankExampleCkptC(t *testing.T) {
	build := buildLibcairn(t)
	prog := filepath.Join(build, "ckpt")
	cc(t, ".", "-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", "-I", filepath.Join(repo(t), "deploy", "libcairn"),
		"-o", prog, example(t, "ckpt.c"), "-L", build, "-lcairn", "-pthread", "-Wl,-rpath,"+build)
	ckptExample(t, func(args ...string) *exec.Cmd { return exec.Command(prog, args...) })
}

func TestRankExampleCkptPython(t *testing.T) {
	ckptExample(t, func(args ...string) *exec.Cmd {
		return pythonCmd(t, append([]string{example(t, "ckpt.py")}, args...)...)
	})
}

// TestRankExampleAppmode: appmode.py saves its state on prepare, and a
// restart from it ends with the checksum of a run alone.
func TestRankExampleAppmode(t *testing.T) {
	dir := t.TempDir()
	args := []string{example(t, "appmode.py"), "--steps", "400", "--every", "100", "--sleep-ms", "5", "--dir", dir}
	alone := output(t, pythonCmd(t, args...), filepath.Join(t.TempDir(), "none", "rank.sock"), "CAIRN_RANK=1")
	os.RemoveAll(dir)

	s := ranktest.New(t, ranktest.Config{Dir: socketDir(t), Job: "app", Rank: 1, Mode: "app", Pending: 10 * time.Millisecond, Frozen: 50 * time.Millisecond})
	cmd := pythonCmd(t, args...)
	cmd.Env = append(cmd.Env, "CAIRN_SOCKET="+s.Path(), "CAIRN_RANK=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); s.Watchers() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("appmode.py never watched:\n%s", out.String())
		}
	}
	if err := s.Checkpoint(ranktest.Done); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("appmode.py: %v\n%s", err, out.String())
	}
	if tr := strings.Join(s.Trace(), ","); !strings.Contains(tr, "ready,freeze,commit 1") {
		t.Fatalf("trace %s: want a round committed after ready", tr)
	}
	m := regexp.MustCompile(`rank 1: saved step (\d+) for checkpoint 1`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no state saved:\n%s", out.String())
	}
	if got, want := final(t, out.String()), final(t, alone); got != want {
		t.Errorf("with a checkpoint: %s; alone: %s", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "rank-1.json.tmp")); !os.IsNotExist(err) {
		t.Errorf("a temporary file is left: %v", err)
	}

	// A restart from checkpoint 1: the command afresh on its files.
	s2 := ranktest.New(t, ranktest.Config{Dir: socketDir(t), Job: "app", Rank: 1, Mode: "app", Ckpt: 1})
	restarted := output(t, pythonCmd(t, args...), s2.Path(), "CAIRN_RANK=1", "CAIRN_RESTART=1")
	has(t, restarted, "rank 1: restarted from checkpoint 1, at step "+m[1])
	if got, want := final(t, restarted), final(t, alone); got != want {
		t.Errorf("restarted: %s; alone: %s", got, want)
	}
	if step, _ := strconv.Atoi(m[1]); step == 0 || step >= 400 {
		t.Errorf("saved at step %d: the round did not come mid-run", step)
	}
}

// TestRankExampleWatch: watch.py's client closes its connection before
// each round and opens it again after; its server sees every number in
// order.
func TestRankExampleWatch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	server := pythonCmd(t, example(t, "watch.py"), "--serve", "1")
	server.Env = append(server.Env, "WATCH_SERVER="+addr)
	var sout bytes.Buffer
	server.Stdout, server.Stderr = &sout, &sout
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Kill(); server.Wait() })

	s := ranktest.New(t, ranktest.Config{Dir: socketDir(t), Job: "w", Pending: 10 * time.Millisecond, Frozen: 100 * time.Millisecond})
	client := pythonCmd(t, example(t, "watch.py"), "--steps", "100", "--sleep-ms", "20")
	client.Env = append(client.Env, "WATCH_SERVER="+addr, "CAIRN_SOCKET="+s.Path(), "CAIRN_RANK=0", "CAIRN_SIZE=2")
	var cout bytes.Buffer
	client.Stdout, client.Stderr = &cout, &cout
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Process.Kill(); client.Wait() })
	for deadline := time.Now().Add(20 * time.Second); s.Watchers() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("watch.py never watched:\n%s", cout.String())
		}
	}
	for _, o := range []ranktest.Outcome{ranktest.Done, ranktest.Restored} {
		if err := s.Checkpoint(o); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); s.Watchers() == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("watch.py never watched again:\n%s", cout.String())
			}
		}
	}
	if err := client.Wait(); err != nil {
		t.Fatalf("client: %v\n%s", err, cout.String())
	}
	if err := server.Wait(); err != nil {
		t.Fatalf("server: %v\n%s", err, sout.String())
	}
	has(t, cout.String(), "rank 0: closed the connection for checkpoint 1", "rank 0: reconnected, running on (newest checkpoint 1)",
		"rank 0: closed the connection for checkpoint 2", "rank 0: reconnected, restored from checkpoint 2", "rank 0: done, 100 messages")
	has(t, sout.String(), "server: rank 0: 100 messages in order", "server: OK")
}
