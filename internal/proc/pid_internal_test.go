package proc

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// leaderExitsEnv makes this test binary a process whose first thread
// exits on its own while another thread goes on: what a killed
// multi-threaded process looks like for a moment.
const leaderExitsEnv = "CAIRN_PROC_TEST_LEADER_EXITS"

func init() {
	if os.Getenv(leaderExitsEnv) == "" {
		return
	}
	// Called from init, this keeps the main goroutine on the first thread.
	runtime.LockOSThread()
	go func() {
		os.Stdout.WriteString("ready\n")
		select {}
	}()
	time.Sleep(100 * time.Millisecond)
	syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0) // this thread only
}

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     stat
		bad      bool
	}{
		{"plain", "42 (sleep) S 7 42 42 0", stat{"sleep", 'S', 7, 0}, false},
		{"zombie", "42 (sh) Z 1 42 42 0", stat{"sh", 'Z', 1, 0}, false},
		{"spaces and parentheses in the name", "42 (a (b) c) R 9 1", stat{"a (b) c", 'R', 9, 0}, false},
		{"whole line", "42 (x y) S 1 42 42 0 -1 4194560 123 0 0 0 5 3 0 0 20 0 1 0 3516865 2473984 211 18446744073709551615",
			stat{"x y", 'S', 1, 3516865}, false},
		{"start time not a number", "42 (x) S 1 42 42 0 -1 4194560 123 0 0 0 5 3 0 0 20 0 1 0 later 2473984", stat{}, true},
		{"no name", "42 S 7", stat{}, true},
		{"truncated", "42 (x) S", stat{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat([]byte(tc.in))
			if (err != nil) != tc.bad || got != tc.want {
				t.Errorf("parseStat(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.bad)
			}
		})
	}
}

// TestStateAndStatus: this process's state, name and status fields; a
// process or field that is not there.
func TestStateAndStatus(t *testing.T) {
	state, comm, err := State(os.Getpid())
	if err != nil || (state != 'R' && state != 'S') || comm == "" {
		t.Errorf("State(self) = %c %q %v", state, comm, err)
	}
	if st, start, err := Started(os.Getpid()); err != nil || (st != 'R' && st != 'S') || start == 0 {
		t.Errorf("Started(self) = %c %d %v", st, start, err)
	}
	if _, _, err := Started(0); err == nil {
		t.Error("Started(0) found a process")
	}
	if name, ok := StatusField(0, "Name"); !ok || name != comm {
		t.Errorf("StatusField(self, Name) = %q %v, want %q", name, ok, comm)
	}
	if pid, ok := StatusField(os.Getpid(), "Pid"); !ok || pid != strconv.Itoa(os.Getpid()) {
		t.Errorf("StatusField(pid, Pid) = %q %v", pid, ok)
	}
	if v, ok := StatusField(0, "NoSuchField"); ok {
		t.Errorf("StatusField(NoSuchField) = %q", v)
	}
	if _, _, err := State(-1); err == nil {
		t.Error("State(-1): no error")
	}
}

func TestRuns(t *testing.T) {
	if !Runs(os.Getpid()) {
		t.Error("this process does not run")
	}
	for _, pid := range []int{0, -1} {
		if Runs(pid) {
			t.Errorf("pid %d runs", pid)
		}
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !Runs(pid) || Parent(pid) != os.Getpid() || !slices.Contains(Children(os.Getpid()), pid) {
		t.Fatalf("child %d: runs %v, parent %d, children of this process %v", pid, Runs(pid), Parent(pid), Children(os.Getpid()))
	}
	_ = cmd.Process.Kill()
	// Killed but not reaped: a zombie, which has ended.
	for i := 0; i < 1000 && Runs(pid); i++ {
		time.Sleep(time.Millisecond)
	}
	if Runs(pid) {
		t.Error("a killed, unreaped child still runs")
	}
	if slices.Contains(Children(os.Getpid()), pid) {
		t.Error("a zombie is listed among the children")
	}
	_ = cmd.Wait()
	if Runs(pid) || Parent(pid) != 0 {
		t.Errorf("reaped child: runs %v, parent %d", Runs(pid), Parent(pid))
	}
}

// TestRunsUntilTheLastThread: a process whose first thread is a zombie
// while another thread still runs has not ended (it still holds its
// files); once that thread is gone too, it has.
func TestRunsUntilTheLastThread(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), leaderExitsEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("helper said %q, %v", line, err)
	}
	for i := 0; i < 5000; i++ {
		if st, err := readStat(pid); err == nil && st.state == 'Z' {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if st, err := readStat(pid); err != nil || st.state != 'Z' {
		t.Fatalf("helper's first thread: %+v, %v; want a zombie", st, err)
	}
	if !Runs(pid) {
		t.Fatalf("a process with a live thread (%d listed) does not run", threadsLeft(pid))
	}
	_ = cmd.Process.Kill()
	for i := 0; i < 5000 && Runs(pid); i++ {
		time.Sleep(time.Millisecond)
	}
	if Runs(pid) {
		t.Fatalf("killed process still runs: %d threads listed", threadsLeft(pid))
	}
}
