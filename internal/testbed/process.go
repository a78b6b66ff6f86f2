package testbed

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cairn-hpc/cairn/internal/proc"
)

// Spawn starts argv detached (a session of its own, output appended to
// logPath, env added to this process's environment) and returns its pid.
// The process is reaped if it exits while this one lives.
func Spawn(logPath string, argv, env []string) (int, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err != nil {
		return 0, err
	}
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer lf.Close()
	c := exec.Command(argv[0], argv[1:]...)
	c.Stdout, c.Stderr = lf, lf
	if env != nil {
		c.Env = append(os.Environ(), env...)
	}
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		return 0, err
	}
	go func() { _ = c.Wait() }()
	return c.Process.Pid, nil
}

// Running reports whether process pid runs (a zombie has exited).
func Running(pid int) bool { return proc.Runs(pid) }

// stop ends a process the testbed started: SIGTERM, then SIGKILL.
func stop(pid int) {
	if !Running(pid) {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 50 && Running(pid); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if Running(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 50 && Running(pid); i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// kill SIGKILLs a process and waits until it has exited.
func kill(pid int) error {
	if !Running(pid) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	for Running(pid) {
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
