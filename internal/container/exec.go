package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"cairn/internal/proc"
)

// ErrUserNSExec is returned by Exec for a --userns container: runc joins
// its user namespace before its network namespace, which belongs to the
// host's user namespace, and the kernel refuses that.
var ErrUserNSExec = errors.New("exec into a container with a user namespace of its own (--userns) is not supported: its network namespace belongs to the host's user namespace")

// Exec runs a command inside a running container with the given stdio and
// returns its exit code.
func (m *Manager) Exec(ctx context.Context, name string, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	in, err := m.Get(ctx, name)
	if err != nil {
		return -1, err
	}
	if in.Status != StatusRunning {
		return -1, fmt.Errorf("%w: %s is %s", ErrNotRunning, name, in.Status)
	}
	if in.Config.UserNS {
		return -1, fmt.Errorf("exec in %s: %w", name, ErrUserNSExec)
	}
	a := m.runc.argv("", append([]string{"exec", m.runcID(name)}, args...)...)
	cmd := exec.CommandContext(ctx, a[0], a[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return -1, fmt.Errorf("exec in %s: %w", name, err)
	}
	return 0, nil
}

// ErrExecProcesses is returned (wrapped) by a checkpoint of a container
// that holds processes started with Exec (runc exec): they live in the
// container but outside its init's tree, and CRIU dumps a tree, so it
// would silently leave them out and a restore would lack them. Such
// processes must end before the container is checkpointed; a job's
// launcher and daemons run as children of its rank's init for this reason
// (internal/launch).
var ErrExecProcesses = errors.New("the container holds processes started with exec, which a checkpoint would leave out")

// execProcesses returns the processes of the container's cgroup (read
// through its freezer, which shares the container's cgroup path) that do
// not descend from its init, each as "PID (COMM)".
func execProcesses(f freezer, initPID int) ([]string, error) {
	pids, err := f.procs()
	if err != nil {
		return nil, err
	}
	in := map[int]bool{}
	for _, pid := range pids {
		in[pid] = true
	}
	var out []string
	for _, pid := range pids {
		p := pid
		for p != initPID && in[p] {
			p = proc.Parent(p)
		}
		if p != initPID {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			out = append(out, fmt.Sprintf("%d (%s)", pid, strings.TrimSpace(string(comm))))
		}
	}
	return out, nil
}
