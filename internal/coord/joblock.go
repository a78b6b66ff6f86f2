package coord

import "sync"

// jobLocks serialize the work on each job (rounds, restarts, migrations,
// settling, kill and rm), or on anything else a name stands for. An entry
// lives only while its lock is held or awaited, so that names asked for in
// vain leave nothing behind. The zero value is ready to use.
type jobLocks struct {
	mu   sync.Mutex
	held map[string]*jobMutex
}

// jobMutex is a job's lock and how many hold or await it.
type jobMutex struct {
	sync.Mutex
	refs int
}

// lock takes job's lock and returns its unlock.
func (l *jobLocks) lock(job string) (unlock func()) {
	unlock, _ = l.take(job, false)
	return unlock
}

// tryLock is lock that gives up at once if the job is busy.
func (l *jobLocks) tryLock(job string) (unlock func(), ok bool) {
	return l.take(job, true)
}

func (l *jobLocks) take(job string, try bool) (func(), bool) {
	l.mu.Lock()
	if l.held == nil {
		l.held = map[string]*jobMutex{}
	}
	m := l.held[job]
	if m == nil {
		m = &jobMutex{}
		l.held[job] = m
	}
	m.refs++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if m.refs--; m.refs == 0 {
			delete(l.held, job)
		}
		l.mu.Unlock()
	}
	if try {
		if !m.TryLock() {
			release()
			return nil, false
		}
	} else {
		m.Lock()
	}
	return func() { m.Unlock(); release() }, true
}
