package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cairn-hpc/cairn/internal/proc"
)

// freezer freezes and thaws a container's cgroup directly. runc pause and
// resume do the same but cost a runc process start each, which the
// application pays as stall on every checkpoint.
type freezer struct {
	state  string // v1: freezer.state; v2: cgroup.freeze
	events string // v2 only: cgroup.events
}

// freezerFor finds the freezer of a cgroups path: the v1 freezer hierarchy
// if it is mounted, else cgroup v2.
func freezerFor(cgroupsPath string) (freezer, error) {
	v1 := filepath.Join("/sys/fs/cgroup/freezer", cgroupsPath, "freezer.state")
	if _, err := os.Stat(v1); err == nil {
		return freezer{state: v1}, nil
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		v2 := filepath.Join(root, cgroupsPath, "cgroup.freeze")
		if _, err := os.Stat(v2); err == nil {
			return freezer{state: v2, events: filepath.Join(root, cgroupsPath, "cgroup.events")}, nil
		}
	}
	return freezer{}, fmt.Errorf("no freezer for cgroup %s", cgroupsPath)
}

func (f freezer) set(ctx context.Context, frozen bool) error {
	val, want := "THAWED", "THAWED"
	if frozen {
		val, want = "FROZEN", "FROZEN"
	}
	if f.events != "" {
		val, want = "0", "frozen 0"
		if frozen {
			val, want = "1", "frozen 1"
		}
	}
	// Freezing can take more than one write: tasks in uninterruptible
	// sleep keep the v1 state at FREEZING. Retry as runc does.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := os.WriteFile(f.state, []byte(val), 0); err != nil {
			return fmt.Errorf("write %s: %w", f.state, err)
		}
		check := f.state
		if f.events != "" {
			check = f.events
		}
		b, err := os.ReadFile(check)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup did not reach %s: %s", want, strings.TrimSpace(string(b)))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// ErrDamaged is returned, wrapped, by a checkpoint whose dump died with
// CRIU's parasite still inside the container's processes: they cannot run
// on correctly, and the container must be restored from a checkpoint.
var ErrDamaged = errors.New("container processes damaged by an interrupted dump")

// parasiteIn returns a process of the cgroup that still maps CRIU's
// parasite blob (compel maps it from a memfd named CRIUMFD), 0 if none: a
// dump that died half-way leaves it there, and the process then runs the
// parasite's code instead of its own.
func parasiteIn(f freezer) int {
	return f.find(false, "maps", func(maps []byte) bool { return bytes.Contains(maps, []byte("memfd:CRIUMFD")) })
}

// procs returns the processes of the cgroup (not their other threads).
func (f freezer) procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(f.state), "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, s := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(s); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// find returns the first process of the cgroup (with threads, the first
// task) whose /proc file file satisfies match, 0 if none.
func (f freezer) find(threads bool, file string, match func([]byte) bool) int {
	for _, pid := range f.tasks(threads) {
		if c, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/" + file); err == nil && match(c) {
			return pid
		}
	}
	return 0
}

// tasks lists the processes of the cgroup, or with threads every task
// (cgroup v1 lists every task either way).
func (f freezer) tasks(threads bool) []int {
	list := "cgroup.procs"
	switch {
	case f.events == "": // v1 lists every task in tasks
		list = "tasks"
	case threads:
		list = "cgroup.threads"
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(f.state), list))
	if err != nil {
		return nil
	}
	var out []int
	for _, s := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(s); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// ErrStoppedProcesses is returned (wrapped) by a checkpoint of a
// container that holds a stopped task: one stopped by a signal (SIGSTOP,
// SIGTSTP, SIGTTIN, SIGTTOU) or by a tracer (a debugger). CRIU seizes it
// and then waits for a stop that never comes, until --dump-timeout ends
// the dump (10 minutes by default); cairn refuses at once instead.
var ErrStoppedProcesses = errors.New("the container holds a stopped process, which CRIU cannot dump")

// stoppedTask returns, as "PID (COMM) stopped by a signal" or "... by a
// tracer", every task of the cgroup whose state is stopped (T) or traced
// (t): see ErrStoppedProcesses. Only a cgroup that is not frozen tells:
// frozen, a stopped task shows as D.
func (f freezer) stoppedTasks() []string {
	var out []string
	for _, pid := range f.tasks(true) {
		state, comm, err := proc.State(pid)
		by := map[byte]string{'T': "a signal", 't': "a tracer"}[state]
		if err != nil || by == "" {
			continue
		}
		out = append(out, fmt.Sprintf("pid %s in the container (%d on the host, %s) stopped by %s", nsPID(pid), pid, comm, by))
	}
	return out
}

// nsPID returns the PID of host task pid in its own (innermost) pid
// namespace, from /proc/PID/status's NSpid; pid itself if unknown.
func nsPID(pid int) string {
	if v, ok := proc.StatusField(pid, "NSpid"); ok {
		if f := strings.Fields(v); len(f) > 0 {
			return f[len(f)-1]
		}
	}
	return strconv.Itoa(pid)
}

// vforkWaits are the kernel functions a task that called vfork sleeps in
// until its child execs or exits (wait_for_vfork_done, inlined into the
// clone entry on most builds).
var vforkWaits = []string{"wait_for_vfork_done", "kernel_clone", "_do_fork", "do_fork"}

// inVfork returns a task of the frozen cgroup that waits for a vfork child,
// 0 if none. CRIU cannot dump such a pair: once it seizes the child before
// its exec, the parent never reaches a ptrace stop, and the dump fails
// after CRIU's timeout (10 s). Shells start commands with vfork.
func (f freezer) inVfork() int {
	return f.find(true, "wchan", func(w []byte) bool { return slices.Contains(vforkWaits, string(w)) })
}

// settleVfork lets a frozen cgroup run for a moment and freezes it again
// until no task waits for a vfork child, up to a second; a vfork's child
// execs within microseconds. It reports whether the cgroup settled.
func (f freezer) settleVfork(ctx context.Context) (bool, error) {
	deadline := time.Now().Add(time.Second)
	for f.inVfork() != 0 {
		if time.Now().After(deadline) {
			return false, nil
		}
		if err := f.set(ctx, false); err != nil {
			return false, err
		}
		time.Sleep(200 * time.Microsecond)
		if err := f.set(ctx, true); err != nil {
			return false, err
		}
	}
	return true, nil
}

// Pause freezes a running container and Resume thaws it. A job's ranks,
// restored paused, are resumed together once all are restored. Pause
// freezes on behalf of this process: should it end before Resume, the
// container's watchdog resumes the container and lifts its network lock.
func (m *Manager) Pause(ctx context.Context, name string) error { return m.setFrozen(ctx, name, true) }

// Resume thaws a container frozen by Pause or restored paused. A
// container restored paused from a files-only checkpoint (status created:
// its init made, its command not started) has its command started.
func (m *Manager) Resume(ctx context.Context, name string) error {
	if err := m.setFrozen(ctx, name, false); err != nil {
		return err
	}
	st, err := m.loadState(name)
	if err != nil || !st.StartPending {
		return err
	}
	return m.startPending(ctx, st)
}

// startPending starts the command of a container made by runc create, and
// records that it is started.
func (m *Manager) startPending(ctx context.Context, st *State) error {
	name := st.Config.Name
	if err := m.runc.run(ctx, filepath.Join(m.dir(name), "runc.log"), "start", m.runcID(name)); err != nil {
		// Started meanwhile by another Resume: done all the same.
		if rs, serr := m.runc.state(ctx, m.runcID(name)); serr != nil || rs.Status == StatusCreated || rs.Status == StatusStopped {
			return fmt.Errorf("start %s: %w", name, err)
		}
	}
	st.StartPending = false
	return m.saveState(st)
}

func (m *Manager) setFrozen(ctx context.Context, name string, frozen bool) error {
	st, err := m.loadState(name)
	if err != nil {
		return err
	}
	fz, err := freezerFor(st.CgroupsPath)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	marker := filepath.Join(m.dir(name), freezeMarker)
	if !frozen {
		if err := fz.set(ctx, false); err != nil {
			return err
		}
		if n, err := readFreezeNote(marker); err == nil && n.PID == os.Getpid() {
			os.Remove(marker)
		}
		return nil
	}
	// No dump runs under a pause: the deadline only matters once this
	// process is gone, and then the watchdog resumes the container anyway.
	if err := writeFreezeNote(marker, freezeNote{PID: os.Getpid(), Deadline: time.Now().Unix()}); err != nil {
		return err
	}
	return fz.set(ctx, true)
}
