package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/proc"
)

// A checkpoint freezes its container and, on a cluster, its caller locks
// the container's network. Whoever does so writes a freeze note (the
// frozen-by file in the container's dir) first, and removes it once the
// container runs again. If the process that froze the container dies
// before it thaws it (SIGKILL, a node agent killed mid-round), the note
// stays behind, and two parties act on it:
//
//   - the container's shim, which lives as long as the container, looks
//     for an abandoned note every watchInterval and releases the container
//     by itself: no other command needs to run (watchFreeze);
//   - every cairn command that reads the container's state does the same
//     (Manager.Get), so nothing waits for the shim's next look.
//
// An abandoned dump whose runc or CRIU still runs is let finish (CRIU then
// leaves the processes as it found them) until the note's deadline, and
// killed after it.

// freezeMarker is the file in a container's dir holding its freeze note.
const freezeMarker = "frozen-by"

// watchInterval is how often a shim looks for an abandoned freeze.
var watchInterval = 250 * time.Millisecond

// freezeNote says who froze a container and until when its dump may run.
type freezeNote struct {
	PID      int   `json:"pid"`            // the process that froze the container
	Runc     int   `json:"runc,omitempty"` // its runc checkpoint, once started
	Deadline int64 `json:"deadline"`       // unix seconds; past it an abandoned dump is killed
}

func writeFreezeNote(path string, n freezeNote) error {
	b, err := json.Marshal(n)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// readFreezeNote reads a note; the older "PID [RUNCPID]" form has no
// deadline (its dump may run on).
func readFreezeNote(path string) (freezeNote, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return freezeNote{}, err
	}
	var n freezeNote
	if json.Unmarshal(b, &n) == nil && n.PID > 0 {
		return n, nil
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return freezeNote{}, fmt.Errorf("empty freeze note %s", path)
	}
	n.PID, err = strconv.Atoi(f[0])
	if err != nil {
		return freezeNote{}, fmt.Errorf("freeze note %s: %q", path, b)
	}
	if len(f) > 1 {
		n.Runc, _ = strconv.Atoi(f[1])
	}
	n.Deadline = time.Now().Add(24 * time.Hour).Unix()
	return n, nil
}

// watchTarget is what releasing an abandoned freeze of one container needs;
// a shim gets it in its spec.
type watchTarget struct {
	Marker   string `json:"marker"`  // the container's freeze note
	Cgroups  string `json:"cgroups"` // its cgroups path
	Netns    string `json:"netns"`   // its network namespace, "" if none
	RuncRoot string `json:"runc_root"`
	ID       string `json:"id"` // runc's id of the container
}

// releaseAbandoned releases the container if its freeze note is abandoned:
// the process that wrote it is gone and so is its dump (or the note's
// deadline is past, and the dump is killed). It thaws the cgroup, lifts
// every network lock left in the container's namespace (cairn's, and
// CRIU's own if CRIU was killed mid-dump), and removes the note. initPID is
// the container's init (0 if unknown). It reports whether it released the
// container.
func releaseAbandoned(ctx context.Context, w watchTarget, initPID int, now time.Time) (bool, error) {
	n, err := readFreezeNote(w.Marker)
	if err != nil {
		return false, nil // no note (or one being written): nothing to do
	}
	if n.PID == os.Getpid() || proc.Runs(n.PID) {
		return false, nil // its owner runs: it thaws the container itself
	}
	late := now.Unix() > n.Deadline
	runcs, criu := findOrphans(w.RuncRoot, w.ID)
	if n.Runc > 0 && proc.Runs(n.Runc) && !slices.Contains(runcs, n.Runc) {
		runcs = append(runcs, n.Runc)
	}
	tracer := 0
	if initPID > 0 {
		tracer = tracerPID(initPID)
	}
	if len(runcs) > 0 || tracer != 0 {
		if !late {
			return false, nil // the orphaned dump may finish by itself
		}
		// CRIU first: it holds the processes. Then runc.
		for _, p := range criu {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if tracer != 0 && isCRIU(tracer) {
			_ = syscall.Kill(tracer, syscall.SIGKILL)
		}
		for _, p := range runcs {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if initPID > 0 && !waitUntraced(initPID, 5*time.Second) {
			return false, fmt.Errorf("CRIU pid %d still holds the container's init", tracerPID(initPID))
		}
	}
	fz, err := freezerFor(w.Cgroups)
	if err == nil {
		err = fz.set(ctx, false)
	}
	if err != nil {
		return false, fmt.Errorf("thaw: %w", err)
	}
	if w.Netns != "" {
		if _, serr := os.Stat(w.Netns); serr == nil {
			if err := errors.Join(netw.UnlockNetns(ctx, w.Netns), netw.DropCRIULock(ctx, w.Netns)); err != nil {
				return false, err
			}
		}
	}
	os.Remove(w.Marker)
	return true, nil
}

// watchFreeze runs in a shim until ctx ends: it releases the container
// whenever a checkpoint abandons it frozen.
func watchFreeze(ctx context.Context, w watchTarget, initPID int) {
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := os.Stat(w.Marker); err != nil {
			continue
		}
		if ok, err := releaseAbandoned(ctx, w, initPID, time.Now()); ok || err != nil {
			line := "released the container from a checkpoint that was cut short"
			if err != nil {
				line = "could not release the container from a checkpoint that was cut short: " + err.Error()
			}
			appendLine(filepath.Join(filepath.Dir(w.Marker), "watchdog.log"), line)
		}
	}
}

func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	fmt.Fprintf(f, "%s %s\n", time.Now().UTC().Format(time.RFC3339Nano), line)
	f.Close()
}

// waitUntraced waits up to d for pid to have no tracer.
func waitUntraced(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for tracerPID(pid) != 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// isCRIU reports whether pid runs CRIU.
func isCRIU(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(b)) == "criu"
}

// tracerPID returns the pid of the process ptrace-attached to pid, or 0.
func tracerPID(pid int) int {
	v, _ := proc.StatusField(pid, "TracerPid")
	n, _ := strconv.Atoi(v)
	return n
}

// Recover releases every container that a checkpoint froze and never
// thawed because the process running it died (recoverFreeze): what an
// agent does as it starts, and the CLI before it works on the data dir,
// so that the next cairn command after an interrupted checkpoint finds
// its containers running. A container this process keeps frozen on
// purpose is left alone. Only containers with a freeze note are looked
// at (a stat each): without one there is nothing to release.
func (m *Manager) Recover(ctx context.Context) error {
	names, err := m.names()
	if err != nil {
		return err
	}
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(m.dir(name), freezeMarker)); err != nil {
			continue
		}
		st, err := m.loadState(name)
		if err != nil {
			continue // being created or removed
		}
		if rs, err := m.runc.state(ctx, m.runcID(name)); err == nil && rs.Status == StatusPaused {
			m.recoverFreeze(ctx, st, rs.Pid)
		}
	}
	return nil
}

// recoverFreeze releases a container that a checkpoint froze and never
// thawed because the process running it died (see watchdog.go), unless
// this process keeps it frozen on purpose.
func (m *Manager) recoverFreeze(ctx context.Context, st *State, initPID int) {
	if m.holds(st.Config.Name) {
		return // a prepared checkpoint of this process keeps it frozen
	}
	ok, err := releaseAbandoned(ctx, m.watchTarget(st), initPID, time.Now())
	switch {
	case err != nil:
		m.log.Warn("release a container an interrupted checkpoint left frozen", "rank", st.Config.Name, "err", err)
	case ok:
		m.log.Warn("released a container an interrupted checkpoint left frozen", "rank", st.Config.Name)
	}
}

// watchTarget is what a watchdog needs to release st's container.
func (m *Manager) watchTarget(st *State) watchTarget {
	netns := ""
	if st.Config.Net != nil {
		netns = st.Config.Net.Netns
	} else if st.Endpoint.Netns != "" {
		netns = netw.NetnsPath(st.Endpoint.Netns)
	}
	return watchTarget{
		Marker:   filepath.Join(m.dir(st.Config.Name), freezeMarker),
		Cgroups:  st.CgroupsPath,
		Netns:    netns,
		RuncRoot: m.runc.root,
		ID:       m.runcID(st.Config.Name),
	}
}
