package container

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cairn-hpc/cairn/internal/proc"
)

// orphans returns the runc processes still checkpointing or restoring the
// container for a cairn command that was killed, and their children (CRIU).
func (m *Manager) orphans(name string) (runcs []int, children []int) {
	return findOrphans(m.runc.root, m.runcID(name))
}

// findOrphans returns the runc processes of state root root checkpointing
// or restoring container id, and their children (CRIU).
func findOrphans(root, id string) (runcs []int, children []int) {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		// The command line first: one read rules out nearly every
		// process (a zombie's is empty).
		b, err := os.ReadFile(p + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte(id)) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) <= 3 || !slices.Contains(args, root) || args[len(args)-1] != id ||
			!(slices.Contains(args, "checkpoint") || slices.Contains(args, "restore")) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(p)); err == nil && proc.Runs(pid) {
			runcs = append(runcs, pid)
		}
	}
	return runcs, proc.Children(runcs...)
}

// waitOrphans waits up to d for orphaned runc processes of the container to
// finish: a new checkpoint must not freeze the container under a dump that
// is still running, or that dump's parasite freezes with it and never
// answers.
func (m *Manager) waitOrphans(name string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		runcs, _ := m.orphans(name)
		if len(runcs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("a checkpoint of %s from a cairn command that was killed is still running (runc pid %v); try again later", name, runcs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killOrphans ends runc processes (and their CRIU children) still working
// on the container for a cairn command that was killed: a container being
// removed must not stay traced by an orphaned dump.
func (m *Manager) killOrphans(name string) {
	runcs, children := m.orphans(name)
	for _, c := range children {
		_ = syscall.Kill(c, syscall.SIGKILL) // CRIU first: it holds the tracees
	}
	for _, r := range runcs {
		_ = syscall.Kill(r, syscall.SIGKILL)
		m.log.Warn("killed an orphaned runc of an interrupted command", "rank", name, "pid", r)
	}
}
