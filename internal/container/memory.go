// A dump must never read a process's memory while some of it is still to
// arrive from a lazy restore (lazy.go): memory registered with
// userfaultfd whose pages have not been copied in yet is not present in
// the process's page tables, so CRIU takes it for memory never touched,
// leaves it out of the image without a word, and the restored process
// finds zeros there. Two things keep that from happening: every dump
// first waits for the container's lazy restore to end (AwaitMemory),
// and after the freeze the kernel is asked whether any memory of the
// container is still registered for missing pages (missingMemory), so
// that a path that skips the wait fails instead of writing a corrupt
// checkpoint.

package container

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// ErrMemoryIncomplete is returned (wrapped) by a checkpoint of a
// container whose memory has not all arrived yet: its lazy restore is
// still going on, or did not end in time. Nothing is dumped and the
// container runs on.
var ErrMemoryIncomplete = errors.New("the container's memory has not all arrived from its lazy restore")

// DefaultMemoryWait is how long a checkpoint waits for the memory of a
// lazily restored container when its caller sets no bound.
const DefaultMemoryWait = 2 * time.Minute

// AwaitMemory waits until the lazy restore of container name, if one is
// going on in this Manager, has every page, for at most within (0:
// DefaultMemoryWait). Meanwhile the restore's prefetch goes at full
// speed. It returns how long it waited; an error wraps
// ErrMemoryIncomplete if the restore did not end in time or failed (and
// ctx.Err() if ctx ended first).
func (m *Manager) AwaitMemory(ctx context.Context, name string, within time.Duration) (time.Duration, error) {
	m.lazyMu.Lock()
	lz := m.lazies[name]
	m.lazyMu.Unlock()
	if lz == nil {
		return 0, nil
	}
	if within <= 0 {
		within = DefaultMemoryWait
	}
	start := time.Now()
	lz.hurry()
	m.log.Info("checkpoint waits for the memory of a lazy restore", "rank", name, "missing_pages", lz.src.missing())
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case <-lz.done:
		waited := time.Since(start)
		if lz.err != nil {
			return waited, fmt.Errorf("checkpoint %s: %w: the lazy restore failed: %v", name, ErrMemoryIncomplete, lz.err)
		}
		m.log.Info("every page is here: the checkpoint goes on", "rank", name, "waited", waited)
		return waited, nil
	case <-timer.C:
		return time.Since(start), fmt.Errorf("checkpoint %s: %w: %d pages still missing after %v; a dump now would record them as zeros, so none is taken (try again once the lazy restore has ended)",
			name, ErrMemoryIncomplete, lz.src.missing(), within.Round(time.Millisecond))
	case <-ctx.Done():
		return time.Since(start), fmt.Errorf("checkpoint %s: waiting for its lazily restored memory: %w", name, ctx.Err())
	}
}

// trackLazy and untrackLazy keep the lazy restores going on, by container.
func (m *Manager) trackLazy(name string, lz *lazyRun) {
	m.lazyMu.Lock()
	defer m.lazyMu.Unlock()
	if m.lazies == nil {
		m.lazies = map[string]*lazyRun{}
	}
	m.lazies[name] = lz
}

func (m *Manager) untrackLazy(name string, lz *lazyRun) {
	m.lazyMu.Lock()
	defer m.lazyMu.Unlock()
	if m.lazies[name] == lz {
		delete(m.lazies, name)
	}
}

// memoryComplete fails with ErrMemoryIncomplete if a process of the
// frozen container name has memory still to arrive (missingMemory).
func memoryComplete(name string, f freezer) error {
	what, err := missingMemory(f)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", name, err)
	}
	if what != "" {
		return fmt.Errorf("checkpoint %s: %w: %s registered with userfaultfd for pages that may not be here (a lazy restore not over?); a dump would record them as zeros", name, ErrMemoryIncomplete, what)
	}
	return nil
}

// missingMemory asks the kernel whether a process of the frozen cgroup
// has memory registered with userfaultfd for missing pages (VmFlags "um"
// in /proc/PID/smaps): memory whose pages may not have arrived yet,
// which a dump would leave out. It names the first such process and how
// many of its mappings are so, or returns "".
func missingMemory(f freezer) (string, error) {
	pids, err := f.procs()
	if err != nil {
		return "", err
	}
	for _, pid := range pids {
		n, err := uffdMappings(pid)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // gone meanwhile (a zombie's smaps are empty)
			}
			return "", err
		}
		if n > 0 {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			return fmt.Sprintf("pid %d (%s): %d mappings", pid, strings.TrimSpace(string(comm)), n), nil
		}
	}
	return "", nil
}

// uffdMappings counts the mappings of pid registered with userfaultfd
// for missing pages.
func uffdMappings(pid int) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("VmFlags:")) {
			continue
		}
		for _, fl := range bytes.Fields(line[len("VmFlags:"):]) {
			if string(fl) == "um" {
				n++
				break
			}
		}
	}
	return n, sc.Err()
}
