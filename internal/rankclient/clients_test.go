package rankclient_test

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/rankclient/ranktest"
)

// The other clients of the rank API, libcairn (C, and Fortran through
// cairn.f90) and the Python module, run testdata/client.{c,py,f90}
// against the fake endpoint.

// repo is the repository's root.
func repo(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// need skips the test if a tool is not on PATH (setup.sh installs them).
func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s on PATH (make setup installs it)", tool)
		}
	}
}

func run(t *testing.T, dir string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// cc is the C compiler: $CC (which may carry flags, as in CC="cc
// -fsanitize=thread"), else cc. The Makefile takes $CC too.
func cc(t *testing.T, dir string, args ...string) {
	t.Helper()
	c := strings.Fields(os.Getenv("CC"))
	if len(c) == 0 {
		c = []string{"cc"}
	}
	need(t, c[0])
	run(t, dir, c[0], append(c[1:], args...)...)
}

// buildLibcairn builds libcairn.so and libcairn.a with its Makefile into
// a directory of the test's, which it returns.
func buildLibcairn(t *testing.T) string {
	need(t, "make")
	build := t.TempDir()
	run(t, repo(t), "make", "-s", "-C", "deploy/libcairn", "BUILD="+build)
	return build
}

// socketDir is a directory for the fake's socket, with a short path.
func socketDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "rank")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// lines reads r's lines into a channel.
func lines(r io.Reader) <-chan string {
	ch := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
		close(ch)
	}()
	return ch
}

// script drives a client program through testdata/client.c's steps (the
// Python one has the same) against a fake it starts 300 ms after the
// program, so that the first call has to wait for the socket.
func script(t *testing.T, cmd *exec.Cmd) {
	dir := socketDir(t)
	cmd.Env = append(cmd.Environ(), "CAIRN_SOCKET="+filepath.Join(dir, "rank.sock"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := lines(stdout)
	expect := func(want ...string) {
		t.Helper()
		for _, w := range want {
			select {
			case got, ok := <-out:
				if !ok {
					t.Fatalf("program ended; want %q\nstderr:\n%s", w, stderr.String())
				}
				if got != w {
					t.Fatalf("program said %q; want %q\nstderr:\n%s", got, w, stderr.String())
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("program said nothing for 20 s; want %q\nstderr:\n%s", w, stderr.String())
			}
		}
	}

	time.Sleep(300 * time.Millisecond)
	frozen := time.Unix(1e9, 0) // the rate limit's clock stands still
	s := ranktest.New(t, ranktest.Config{
		Dir: dir, Job: "sim", Rank: 2, Size: 4, Ckpt: 3,
		Pending: 50 * time.Millisecond, Frozen: 150 * time.Millisecond,
		Now:    func() time.Time { return frozen },
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	s.Next(ranktest.Done, ranktest.Restored, ranktest.Aborted, ranktest.Conflict, ranktest.Done)
	// The first checkpoint's and the first event's replies are lost: the
	// client sends them again, with their ids.
	s.LoseReply("checkpoint")
	s.LoseReply("event")
	expect(
		"info job=sim rank=2 size=4 mode=transparent ckpt=3 restored=0 restored_from=0 incarnation=1",
		"checkpoint done 4",
		"checkpoint restored 5",
		"checkpoint error aborted",
		"checkpoint error conflict",
		"checkpoint_as error forbidden",
		"stop done 6",
		"info job=sim rank=2 size=4 mode=transparent ckpt=6 restored=1 restored_from=5 incarnation=2",
		"event ok",
		"event error bad_request",
		"event error bad_request",
		"events ok=19 limited=6",
		"watching 1",
	)
	evs := s.Events()
	if len(evs) != 20 {
		t.Errorf("%d events published; want 20", len(evs))
	}
	first := ranktest.Event{Kind: "phase.x-1_y", Message: "quote \" backslash \\ newline \n tab \t unicode é ✓ ctrl \x01 end"}
	if len(evs) > 0 && evs[0] != first {
		t.Errorf("first event %+q; want %+q", evs[0], first)
	}
	trace := strings.Join(s.Trace(), ",")
	for _, want := range []string{"round 4,", "commit 5,restore 5,", "abort 6,", "checkpoint stop,round 6,", "repeat checkpoint", "repeat event"} {
		if !strings.Contains(trace, want) {
			t.Errorf("trace %s\nhas no %s", trace, want)
		}
	}
	if n := strings.Count(","+trace+",", ",checkpoint,"); n != 4 {
		t.Errorf("trace %s\nhas %d checkpoints asked for; want 4 (the repeat answered from the first)", trace, n)
	}

	for _, round := range []struct {
		outcome ranktest.Outcome
		want    []string
	}{
		{ranktest.Done, []string{"prepare 7 transparent", "resumed 7"}},
		{ranktest.Aborted, []string{"prepare 8 transparent", "resumed 7"}},
		{ranktest.Restored, []string{"prepare 8 transparent", "restored 8"}},
	} {
		if err := s.Checkpoint(round.outcome); err != nil {
			t.Fatal(err)
		}
		expect(round.want...)
	}
	stdin.Close()
	expect("unwatched 0")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("program: %v\nstderr:\n%s", err, stderr.String())
	}
	for deadline := time.Now().Add(5 * time.Second); s.Watchers() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the watch connection outlived unwatch")
		}
	}
}

// noEndpoint runs a client program whose socket's directory does not
// exist: it must say so, at once.
func noEndpoint(t *testing.T, cmd *exec.Cmd) {
	cmd.Env = append(cmd.Environ(), "CAIRN_SOCKET="+filepath.Join(t.TempDir(), "none", "rank.sock"))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "info error no_endpoint\n" {
		t.Errorf("without an endpoint: %v, %q", err, out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("without an endpoint: took %s", d)
	}
}

func TestRankLibcairn(t *testing.T) {
	build := buildLibcairn(t)
	prog := filepath.Join(build, "client")
	cc(t, ".", "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", filepath.Join(repo(t), "deploy", "libcairn"),
		"-o", prog, "testdata/client.c", "-L", build, "-lcairn", "-pthread", "-Wl,-rpath,"+build)
	t.Run("script", func(t *testing.T) { script(t, exec.Command(prog)) })
	t.Run("no endpoint", func(t *testing.T) { noEndpoint(t, exec.Command(prog, "noendpoint")) })
	t.Run("static", func(t *testing.T) {
		static := filepath.Join(build, "client-static")
		cc(t, ".", "-std=c99", "-I", filepath.Join(repo(t), "deploy", "libcairn"),
			"-o", static, "testdata/client.c", filepath.Join(build, "libcairn.a"), "-pthread")
		noEndpoint(t, exec.Command(static, "noendpoint"))
	})
}

// TestRankLibcairnCxx: cairn.h is usable from C++ as it is (a missing
// extern "C" would fail the link).
func TestRankLibcairnCxx(t *testing.T) {
	need(t, "c++")
	build := buildLibcairn(t)
	src := filepath.Join(build, "client.cc")
	prog := filepath.Join(build, "client-cxx")
	code := `#include <cairn.h>
#include <cstdio>
int main() {
	struct cairn_info info; // "struct": the function of the same name hides the type, as stat does
	int rc = cairn_info(&info);
	std::printf("info error %s\n", rc == CAIRN_ENOENDPOINT ? "no_endpoint" : cairn_strerror(rc));
}
`
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, ".", "c++", "-Wall", "-Werror", "-I", filepath.Join(repo(t), "deploy", "libcairn"),
		"-o", prog, src, "-L", build, "-lcairn", "-pthread", "-Wl,-rpath,"+build)
	noEndpoint(t, exec.Command(prog))
}

// TestRankLibcairnFortran: cairn.f90's interfaces match libcairn.
func TestRankLibcairnFortran(t *testing.T) {
	need(t, "gfortran")
	build := buildLibcairn(t)
	prog := filepath.Join(build, "client-fortran")
	run(t, ".", "gfortran", "-std=f2008", "-Wall", "-Werror", "-J", build, "-o", prog,
		filepath.Join(repo(t), "deploy", "libcairn", "cairn.f90"), "testdata/client.f90",
		"-L", build, "-lcairn", "-Wl,-rpath,"+build)
	s := ranktest.New(t, ranktest.Config{Dir: socketDir(t), Job: "fsim", Rank: 1, Size: 3, Ckpt: 3, Pending: 50 * time.Millisecond, Frozen: 100 * time.Millisecond})
	cmd := exec.Command(prog)
	cmd.Env = append(os.Environ(), "CAIRN_SOCKET="+s.Path())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := "info 0 fsim 1 3 transparent 3\ncheckpoint 0 1 4\nevent 0\nstrerror forbidden: another job or rank than the caller's\n"
	if d := cmp.Diff(want, string(out)); d != "" {
		t.Errorf("output (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]ranktest.Event{{Kind: "fortran", Message: "from Fortran"}}, s.Events()); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
}

func TestRankPython(t *testing.T) {
	need(t, "python3")
	python := func(args ...string) *exec.Cmd {
		cmd := exec.Command("python3", append([]string{"testdata/client.py"}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repo(t), "deploy", "python"), "PYTHONDONTWRITEBYTECODE=1")
		return cmd
	}
	t.Run("script", func(t *testing.T) { script(t, python()) })
	t.Run("no endpoint", func(t *testing.T) { noEndpoint(t, python("noendpoint")) })
}

// TestRankLibcairnJSON: libcairn's own JSON writer and reader, case by
// case (testdata/json.txt), against testdata/json.golden: escapes both
// ways, fields cut to their buffers (never inside a UTF-8 sequence),
// numbers clamped, nested values skipped, malformed lines refused. With
// the address and undefined-behaviour sanitizers when cc has them.
func TestRankLibcairnJSON(t *testing.T) {
	need(t, "cc")
	prog := filepath.Join(t.TempDir(), "json")
	args := []string{"-std=c99", "-Wall", "-Wextra", "-Werror", "-g", "-I", filepath.Join(repo(t), "deploy", "libcairn"), "-o", prog, "testdata/json.c", "-pthread"}
	san := append([]string{"-fsanitize=address,undefined", "-fno-sanitize-recover=all"}, args...)
	if out, err := exec.Command("cc", san...).CombinedOutput(); err != nil {
		t.Logf("without sanitizers: %v\n%s", err, out)
		run(t, ".", "cc", args...)
	}
	in, err := os.Open("testdata/json.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	cmd := exec.Command(prog)
	cmd.Stdin = in
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want, err := os.ReadFile("testdata/json.golden")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), string(out)); d != "" {
		t.Errorf("output (-want +got):\n%s", d)
	}
}
