package launch

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// reaper waits for every child of the process, as a container's init must:
// orphans of the job (an orted's children whose parent died) are
// reparented to it. It is the only caller of wait4 in the process, so
// nothing here uses os/exec (whose Wait would race with it). Children are
// started with syscall.ForkExec, which, unlike os.StartProcess, keeps no
// pidfd open: a pidfd is one more thing for CRIU to dump.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	early   map[int]syscall.WaitStatus // reaped before spawn registered them
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan syscall.WaitStatus{}, early: map[int]syscall.WaitStatus{}}
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for range ch {
			r.reap()
		}
	}()
	return r
}

func (r *reaper) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		if w, ok := r.waiters[pid]; ok {
			w <- ws
			delete(r.waiters, pid)
		} else {
			r.early[pid] = ws // an orphan, or a child not registered yet
			if len(r.early) > 4096 {
				clear(r.early) // orphans nobody waits for
			}
		}
		r.mu.Unlock()
	}
}

// spawn starts argv[0] (an absolute path) with env and the given file
// descriptors as its 0, 1, 2 in a process group of its own, and returns
// its pid and a channel that receives its wait status.
func (r *reaper) spawn(argv, env []string, dir string, fds []uintptr) (int, <-chan syscall.WaitStatus, error) {
	w := make(chan syscall.WaitStatus, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{
		Dir: dir, Env: env, Files: fds,
		Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		return 0, nil, err
	}
	if ws, ok := r.early[pid]; ok {
		delete(r.early, pid)
		w <- ws
	} else {
		r.waiters[pid] = w
	}
	return pid, w, nil
}

// exitCode is a wait status as a shell reports it: the exit status, or
// 128+N for a process killed by signal N.
func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}
