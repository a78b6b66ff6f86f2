package proc

import (
	"errors"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// RunGroup runs cmd in a process group of its own and returns the head of
// its output (stdout and stderr). When cmd's context ends the whole group
// is killed, and so is whatever the command leaves running in its group
// when it ends: nothing it started outlives the run, and Wait returns at
// most a second later even if a process that left the group holds the
// output open.
func RunGroup(cmd *exec.Cmd) ([]byte, error) {
	out := &headBuffer{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var mu sync.Mutex
	ended := false
	cmd.Cancel = func() error {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			return nil // its group is killed already
		}
		return killGroup(cmd.Process.Pid)
	}
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// Wait for the command to end without reaping it: until it is reaped,
	// its pid (the group's id) cannot be reused, so killing the group
	// kills no one else.
	pid := cmd.Process.Pid
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	mu.Lock()
	_ = killGroup(pid)
	ended = true
	mu.Unlock()
	err := cmd.Wait()
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil // it succeeded; a process that left its group kept the output open
	}
	return out.Bytes(), err
}

// killGroup kills the process group pgid; one that is gone is no error.
func killGroup(pgid int) error {
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// headBuffer keeps the first max bytes written to it and drops the rest.
type headBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *headBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := min(len(p), b.max-len(b.buf)); n > 0 {
		b.buf = append(b.buf, p[:n]...)
	}
	return len(p), nil
}

func (b *headBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf
}
