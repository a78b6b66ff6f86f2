package container

import (
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/proc"
)

// TestFindOrphans: a process whose command line is a runc checkpoint or
// restore of the container, under cairn's runc root, is found with its
// children; one of another container, another root or another command
// is not, and neither is one that has ended.
func TestFindOrphans(t *testing.T) {
	start := func(args ...string) *exec.Cmd {
		t.Helper()
		// python3 -c CODE ARGS...: ARGS are the rest of its command line.
		cmd := exec.Command("python3", append([]string{"-c", "import os, time\nif os.fork() == 0: os.execvp('sleep', ['sleep', '30'])\ntime.sleep(30)"}, args...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	root := t.TempDir()
	dump := start("runc", "--root", root, "checkpoint", "--image-path", "/x", "c1")
	restore := start("runc", "--root", root, "restore", "-d", "c2")
	start("runc", "--root", root, "checkpoint", "--image-path", "/x", "c10")
	start("runc", "--root", root+"-other", "checkpoint", "--image-path", "/x", "c1")
	start("runc", "--root", root, "state", "c1")
	var runcs, children []int
	deadline := time.Now().Add(10 * time.Second)
	for {
		if runcs, children = findOrphans(root, "c1"); len(children) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the child is forked
	}
	if !slices.Equal(runcs, []int{dump.Process.Pid}) || len(children) != 1 {
		t.Fatalf("orphans of c1: %v, children %v; want [%d] and its child", runcs, children, dump.Process.Pid)
	}
	if runcs, _ := findOrphans(root, "c2"); !slices.Equal(runcs, []int{restore.Process.Pid}) {
		t.Fatalf("orphans of c2: %v, want [%d]", runcs, restore.Process.Pid)
	}
	// Ended, not yet reaped (a zombie), then reaped.
	_ = dump.Process.Kill()
	for st := byte(0); st != 'Z'; st, _, _ = proc.State(dump.Process.Pid) {
		time.Sleep(time.Millisecond)
	}
	if runcs, _ := findOrphans(root, "c1"); len(runcs) != 0 {
		t.Fatalf("orphans of c1 once it ended: %v", runcs)
	}
	_ = dump.Wait()
	if runcs, _ := findOrphans(root, "c1"); len(runcs) != 0 {
		t.Fatalf("orphans of c1 once reaped: %v", runcs)
	}
}
