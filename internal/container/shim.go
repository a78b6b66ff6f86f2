package container

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/proc"
)

// ShimEnv is the environment variable that carries a shim's spec. A binary
// that finds it set runs [ShimMain] instead of its usual main (cairn's
// `shim` subcommand and test binaries both do).
const ShimEnv = "CAIRN_SHIM_SPEC"

// shimSpec tells a shim what to run and where to write.
type shimSpec struct {
	Runc     []string `json:"runc"`      // argv of `runc run -d` or `runc restore -d`
	Env      []string `json:"env"`       // runc's environment
	PidFile  string   `json:"pid_file"`  // runc --pid-file
	LogPath  string   `json:"log_path"`  // container output, appended
	ExitPath string   `json:"exit_path"` // where to record the init's exit
	RuncLog  string   `json:"runc_log"`  // runc --log, for error messages
	// Control is the shim's control socket, which answers flushes of the
	// output (output.go); "" for none.
	Control string `json:"control,omitempty"`
	// RemoveAfter is removed once runc returns: the staged image of a
	// restore, which nothing needs after that, even if the cairn command
	// that staged it was killed meanwhile.
	RemoveAfter string `json:"remove_after,omitempty"`
	// Watch, if set, makes the shim the container's watchdog: it releases
	// the container when a checkpoint abandons it frozen (watchdog.go).
	Watch *watchTarget `json:"watch,omitempty"`
	// Lazy is the argv of a lazy restore's `criu lazy-pages` daemon
	// (lazy.go), started before runc and watched: if it fails, the
	// container is killed, since its memory that had not arrived would
	// read as zeros.
	Lazy []string `json:"lazy,omitempty"`
}

// ShimMain runs a shim from the spec in $CAIRN_SHIM_SPEC and returns the
// process exit code. The shim reports "ok PID" or "err MESSAGE" on file
// descriptor 3 once runc has started (or failed to start) the container.
func ShimMain() int {
	ready := os.NewFile(3, "ready")
	report := func(format string, a ...any) {
		if ready != nil {
			fmt.Fprintf(ready, format+"\n", a...)
			ready.Close()
			ready = nil
		}
	}
	var spec shimSpec
	if err := json.Unmarshal([]byte(os.Getenv(ShimEnv)), &spec); err != nil {
		report("err bad shim spec: %v", err)
		return 2
	}
	if err := shim(spec, report); err != nil {
		report("err %s", strings.ReplaceAll(err.Error(), "\n", "; "))
		fmt.Fprintln(os.Stderr, "shim:", err)
		return 1
	}
	return 0
}

func shim(spec shimSpec, report func(string, ...any)) error {
	// Become the reaper of the container's init: runc (and CRIU on restore)
	// exit after starting it, and it is reparented to us.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set child subreaper: %w", err)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	// Without its times the output is still kept: lines show no time.
	times, err := os.OpenFile(image.TimesOf(spec.LogPath), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		times = nil
	} else {
		defer times.Close()
	}

	lazyPID := 0
	if len(spec.Lazy) > 0 {
		if lazyPID, err = startLazyDaemon(spec.Lazy); err != nil {
			return err
		}
	}
	// runc gives a container it starts a session keyring of its own, but
	// a restore's processes are CRIU's children and keep the restorer's:
	// host root's, shared with the agent and every restored container.
	// runc is forked with a fresh one. Keyrings are credentials, which are
	// per thread: this thread joins it and forks runc.
	runtime.LockOSThread()
	if err := newSessionKeyring(); err != nil {
		return err
	}
	cmd := exec.Command(spec.Runc[0], spec.Runc[1:]...)
	cmd.Env = spec.Env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, outW
	runErr := cmd.Run()
	if runErr != nil && lazyPID != 0 {
		_ = unix.Kill(lazyPID, unix.SIGKILL)
	}
	inR.Close()
	outW.Close()
	if spec.RemoveAfter != "" {
		_ = os.RemoveAll(spec.RemoveAfter)
	}
	if runErr != nil {
		msg := lastRuncError(spec.RuncLog)
		if msg == "" {
			msg = runErr.Error()
		}
		return errors.New(tidyRuncMessage(msg))
	}
	b, err := os.ReadFile(spec.PidFile)
	if err != nil {
		return fmt.Errorf("read pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("pid file %q: %w", b, err)
	}
	report("ok %d", pid)
	_ = inW // kept open: the container's stdin never sees EOF

	if spec.Watch != nil {
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		go watchFreeze(ctx, *spec.Watch, pid)
	}

	out := newOutput(outR, logf, times)
	go out.run()
	if spec.Control != "" {
		if ctl, err := listenControl(spec.Control); err == nil {
			defer ctl.close()
			go serveControl(ctl, out)
		}
	}

	exit := Exit{Code: -1}
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil { // ECHILD: the init was reaped before it became ours
			break
		}
		if wpid == lazyPID && lazyPID != 0 {
			if !ws.Exited() || ws.ExitStatus() != 0 {
				// The pages that had not arrived would read as zeros.
				exit.Reason = lazyFailed
				_ = unix.Kill(pid, unix.SIGKILL)
				// A frozen task dies only once thawed.
				if spec.Watch != nil {
					if fz, err := freezerFor(spec.Watch.Cgroups); err == nil {
						_ = fz.set(context.Background(), false)
					}
				}
			}
			continue
		}
		if wpid != pid {
			continue
		}
		switch {
		case ws.Exited():
			exit.Code = ws.ExitStatus()
		case ws.Signaled():
			exit.Code = 128 + int(ws.Signal())
			exit.Signal = unix.SignalName(ws.Signal())
		}
		break
	}
	exit.Time = time.Now().UTC()
	if exit.Reason == "" {
		// cairn ended the processes itself first (endLazy).
		if b, err := os.ReadFile(filepath.Join(filepath.Dir(spec.ExitPath), endedByFile)); err == nil {
			exit.Reason = string(b)
		}
	}
	// Everything in the container's pid namespace is gone with its init, so
	// the pipe closes; do not wait forever if something else holds it.
	select {
	case <-out.done:
	case <-time.After(2 * time.Second):
	}
	return writeJSONAtomic(spec.ExitPath, exit)
}

// startShim starts a detached shim for spec and waits until it reports.
// started, if not nil, is called with the shim's pid as soon as it runs.
func (m *Manager) startShim(spec shimSpec, started func(pid int)) (shimPID, initPID int, err error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return 0, 0, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, 0, err
	}
	defer r.Close()
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		w.Close()
		return 0, 0, err
	}
	defer devnull.Close()
	cmd := exec.Command(m.opts.ShimCommand[0], m.opts.ShimCommand[1:]...)
	cmd.Env = append(os.Environ(), ShimEnv+"="+string(b))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return 0, 0, fmt.Errorf("start shim: %w", err)
	}
	w.Close()
	shimPID = cmd.Process.Pid
	if started != nil {
		started(shimPID)
	}
	// Reap the shim in the background if this process lives long enough
	// to see it exit (tests, the demo); otherwise init does.
	go func() { _ = cmd.Wait() }()
	line, rerr := bufio.NewReader(r).ReadString('\n')
	line = strings.TrimSpace(line)
	switch {
	case strings.HasPrefix(line, "ok "):
		initPID, err = strconv.Atoi(strings.TrimPrefix(line, "ok "))
		return shimPID, initPID, err
	case strings.HasPrefix(line, "err "):
		return shimPID, 0, errors.New(strings.TrimPrefix(line, "err "))
	default:
		return shimPID, 0, fmt.Errorf("shim exited without reporting (%v)", rerr)
	}
}

// waitShim waits up to d for the container's shim to exit.
func (m *Manager) waitShim(st *State, d time.Duration) {
	if st.ShimPID <= 0 {
		return
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !proc.Runs(st.ShimPID) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// shimRuns reports whether pid is a live shim (its environment names it).
func shimRuns(pid int) bool {
	if !proc.Runs(pid) {
		return false
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	return err == nil && bytes.Contains(env, []byte(ShimEnv+"="))
}

// newSessionKeyring makes the calling thread join a new, anonymous
// session keyring (keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)), which the
// processes it forks inherit.
func newSessionKeyring() error {
	if _, _, errno := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0); errno != 0 {
		return fmt.Errorf("join a new session keyring: %w", errno)
	}
	return nil
}
