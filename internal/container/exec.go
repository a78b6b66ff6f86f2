package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/proc"
)

// ErrUserNSExec is returned by Exec for a --userns container: runc joins
// its user namespace before its network namespace, which belongs to the
// host's user namespace, and the kernel refuses that.
var ErrUserNSExec = errors.New("exec into a container with a user namespace of its own (--userns) is not supported: its network namespace belongs to the host's user namespace")

// Exec runs a command inside a running container with the given stdio and
// returns its exit code.
func (m *Manager) Exec(ctx context.Context, name string, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	return m.exec(ctx, name, args, execIO{stdin: stdin, stdout: stdout, stderr: stderr})
}

// ExecTTY runs a command inside a running container on a terminal of its
// own, which runc makes (`runc exec -t`) and joins to in and out: the
// command's input, and its output, stdout and stderr merged. in is best a
// terminal (a pty's slave, or the user's): runc sets it raw and gives the
// command's terminal its size, again each time resized delivers (runc is
// sent SIGWINCH, as a terminal's resize does). It returns the command's
// exit code.
func (m *Manager) ExecTTY(ctx context.Context, name string, args []string, in io.Reader, out io.Writer, resized <-chan struct{}) (int, error) {
	return m.exec(ctx, name, args, execIO{stdin: in, stdout: out, stderr: out, tty: true, resized: resized})
}

// execIO is what a command run by exec is connected to.
type execIO struct {
	stdin          io.Reader // nil: none
	stdout, stderr io.Writer
	tty            bool
	resized        <-chan struct{}
}

func (m *Manager) exec(ctx context.Context, name string, args []string, o execIO) (int, error) {
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
	if len(args) == 0 {
		return -1, fmt.Errorf("%w: exec in %s: no command", ErrBadConfig, name)
	}
	if err := execLookup(in.Pid, in.Config.Env, in.Config.Cwd, args[0]); err != nil {
		return -1, fmt.Errorf("exec in %s: %w", name, err)
	}
	runcArgs := []string{"exec"}
	if o.tty {
		runcArgs = append(runcArgs, "--tty")
	}
	a := m.runc.argv("", append(append(runcArgs, m.runcID(name)), args...)...)
	cmd := exec.CommandContext(ctx, a[0], a[1:]...)
	if o.stdin != nil {
		cmd.Stdin = o.stdin
	}
	cmd.Stdout, cmd.Stderr = o.stdout, o.stderr
	// A stdin that is no file is copied by a goroutine that waits for
	// its next read; once the command has exited, it is not waited for.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("exec in %s: %w", name, err)
	}
	if o.tty {
		done := make(chan struct{})
		defer close(done)
		go func() {
			// runc sizes the command's terminal once at its start, which
			// may come before it has the terminal (it is then left 0x0):
			// a few SIGWINCHs early on make it size it again.
			nudges := []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond, time.Second}
			for {
				var nudge <-chan time.Time
				if len(nudges) > 0 {
					nudge = time.After(nudges[0])
				}
				select {
				case <-done:
					return
				case <-o.resized:
				case <-nudge:
					nudges = nudges[1:]
				}
				_ = cmd.Process.Signal(unix.SIGWINCH)
			}
		}()
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), nil
	case errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil:
		// Exited; something it left holds its output open.
		return cmd.ProcessState.ExitCode(), nil
	}
	if err != nil {
		return -1, fmt.Errorf("exec in %s: %w", name, err)
	}
	return 0, nil
}

// Errors of Exec for a command the container cannot run, found before
// runc is asked to (which would fail with a line of its own log and exit
// 255, as a command could).
var (
	ErrExecNotFound      = errors.New("command not found in the container")
	ErrExecNotExecutable = errors.New("command cannot be run in the container")
)

// defaultPath is the PATH runc exec searches when the container's
// environment sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// execLookup finds cmd as runc exec would inside the container whose init
// is pid (its environment env, its working directory cwd): a path with a
// slash from cwd, else each directory of its PATH in turn. Paths are
// resolved inside the container's root (RESOLVE_IN_ROOT), whatever its
// symlinks say. A command that is there but no executable file, in none
// of the directories, is ErrExecNotExecutable; one that is nowhere
// ErrExecNotFound.
func execLookup(pid int, env []string, cwd, cmd string) error {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // the container may just have ended: runc will tell
	}
	defer unix.Close(root)
	if cwd == "" {
		cwd = "/"
	}
	var candidates []string
	switch {
	case path.IsAbs(cmd):
		candidates = []string{cmd}
	case strings.Contains(cmd, "/"):
		candidates = []string{path.Join(cwd, cmd)}
	default:
		dirs := defaultPath
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, "PATH="); ok {
				dirs = v
			}
		}
		for _, d := range filepath.SplitList(dirs) {
			if d == "" {
				d = "."
			}
			if !path.IsAbs(d) {
				d = path.Join(cwd, d)
			}
			candidates = append(candidates, path.Join(d, cmd))
		}
	}
	there := false
	for _, c := range candidates {
		fd, err := unix.Openat2(root, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
			return nil // no openat2 here: runc will tell
		}
		if err != nil {
			continue
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0 {
			return nil
		}
		there = true
	}
	if there {
		return fmt.Errorf("%w: %s is not an executable file", ErrExecNotExecutable, cmd)
	}
	if strings.Contains(cmd, "/") {
		return fmt.Errorf("%w: no file %s (from %s)", ErrExecNotFound, cmd, cwd)
	}
	return fmt.Errorf("%w: no %s in $PATH", ErrExecNotFound, cmd)
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
