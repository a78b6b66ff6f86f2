package proc

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     stat
		bad      bool
	}{
		{"plain", "42 (sleep) S 7 42 42 0", stat{'S', 7}, false},
		{"zombie", "42 (sh) Z 1 42 42 0", stat{'Z', 1}, false},
		{"spaces and parentheses in the name", "42 (a (b) c) R 9 1", stat{'R', 9}, false},
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
