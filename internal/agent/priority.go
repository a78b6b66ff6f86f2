package agent

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// ioprioIdle is IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0): disk time only
// when no one else wants it (honoured by the BFQ scheduler; others ignore
// it).
const ioprioIdle = 3 << 13

// inBackground runs fn on an OS thread of its own at the lowest CPU
// priority (nice 19) and idle I/O priority, and returns its result: how
// replication leaves the CPU to the job's ranks on the same node. The
// thread is never given back (the goroutine ends locked to it, so the
// runtime discards it), so no other goroutine ever runs at that priority;
// threads the runtime starts meanwhile come from its template thread and
// do not inherit it. Goroutines fn starts run at normal priority.
func inBackground(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		tid := unix.Gettid()
		_ = unix.Setpriority(unix.PRIO_PROCESS, tid, 19)
		_, _, _ = unix.Syscall(unix.SYS_IOPRIO_SET, 1 /* IOPRIO_WHO_PROCESS */, uintptr(tid), ioprioIdle)
		done <- fn()
	}()
	return <-done
}
