package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Status is what a container is doing. It is derived when asked (Get),
// never stored: from runc's state while runc knows the container, else
// from the shim's exit record and the container's state file.
type Status string

// The statuses of a container. The first four are also runc's own
// (`runc state`), with its meanings.
const (
	// StatusCreated: runc has made the container's init, which has not
	// started the command yet (a moment within Run).
	StatusCreated Status = "created"
	// StatusRunning: the container's processes run.
	StatusRunning Status = "running"
	// StatusPaused: the container's processes are frozen (a checkpoint,
	// Pause, a restore asked to leave them paused).
	StatusPaused Status = "paused"
	// StatusStopped: nothing of the container runs and no exit was
	// recorded (its runtime was taken down, or its shim died).
	StatusStopped Status = "stopped"
	// StatusExiting: the container's init has ended, and its shim is
	// still copying the last output into the log and recording the exit
	// (at most a few seconds); exited next.
	StatusExiting Status = "exiting"
	// StatusExited: the container's init has ended; Info.Exit says how.
	StatusExited Status = "exited"
	// StatusCheckpointed: a checkpoint with CheckpointOptions.Stop ended
	// the container.
	StatusCheckpointed Status = "checkpointed"
)

// Live reports whether the container's init is there, running or not:
// created, running or paused. A live container can be signalled, and is
// not replaced by a restore nor removed without force.
func (s Status) Live() bool {
	return s == StatusCreated || s == StatusRunning || s == StatusPaused
}

// Active reports whether the container has not ended yet: it is live, or
// exiting (its shim still writes its log and its exit). The log of an
// active container may still grow, and Wait waits for it.
func (s Status) Active() bool { return s.Live() || s == StatusExiting }

// Info is a container's state as shown to users.
type Info struct {
	State
	Name   string `json:"name"`
	Status Status `json:"status"`
	Pid    int    `json:"pid,omitempty"`
	Exit   *Exit  `json:"exit,omitempty"`
	Dir    string `json:"dir"`
	RootFS string `json:"rootfs_path"`
	Log    string `json:"log_path"`
}

// info is what Info says of a container without its status.
func (m *Manager) info(name string, st *State) *Info {
	dir := m.dir(name)
	return &Info{State: *st, Name: name, Dir: dir, RootFS: m.rootPath(st), Log: filepath.Join(dir, logName)}
}

// Get returns a container's current state. It only reads: a container
// an interrupted checkpoint left frozen shows paused until Recover (or
// its shim's watchdog) releases it.
func (m *Manager) Get(ctx context.Context, name string) (*Info, error) {
	st, err := m.loadState(name)
	if err != nil {
		return nil, err
	}
	dir := m.dir(name)
	in := m.info(name, st)
	rs, err := m.runc.state(ctx, m.runcID(name))
	switch {
	case err == nil && rs.Status != StatusStopped:
		in.Status, in.Pid = rs.Status, rs.Pid
		return in, nil
	case err != nil && !errors.Is(err, errNoRuncContainer):
		return nil, err
	}
	in.Status = StatusStopped
	if e, err := readExit(dir); err == nil {
		in.Exit = e
		in.Status = StatusExited
	} else if shimRuns(st.ShimPID) {
		// The init is gone but its shim is still draining the output and
		// writing exit.json: not stopped, about to be exited.
		in.Status = StatusExiting
	}
	if st.Checkpointed {
		in.Status = StatusCheckpointed
	}
	return in, nil
}

// names lists the containers' dirs of the data dir, by name.
func (m *Manager) names() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(m.opts.DataDir, "containers"))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") { // a restore's upper dir being made
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// List returns every container of the data dir, by name.
func (m *Manager) List(ctx context.Context) ([]*Info, error) {
	names, err := m.names()
	if err != nil {
		return nil, err
	}
	var out []*Info
	for _, name := range names {
		in, err := m.Get(ctx, name)
		if errors.Is(err, ErrNotFound) {
			continue // being created or removed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Ended lists the containers whose init has ended (exit.json written by
// their shim) and that a checkpoint did not stop: a cheap read of the data
// dir, with no runc call and no recovery, which an agent reports with
// every heartbeat so that the coordinator learns that a job's ranks have
// ended. Get tells how each ended.
func (m *Manager) Ended() []string {
	names, _ := m.names()
	var out []string
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(m.dir(name), "exit.json")); err != nil {
			continue
		}
		if st, err := m.loadState(name); err != nil || st.Checkpointed {
			continue
		}
		out = append(out, name)
	}
	return out
}

// Unended lists the containers that have not ended (no exit recorded),
// by name: cheap, without runc.
func (m *Manager) Unended() []string {
	names, _ := m.names()
	var out []string
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(m.dir(name), "exit.json")); err == nil {
			continue
		}
		if st, err := m.loadState(name); err != nil || st.Checkpointed {
			continue
		}
		out = append(out, name)
	}
	return out
}

// Wait blocks until the container has ended (is no longer active) and
// returns how it ended.
func (m *Manager) Wait(ctx context.Context, name string) (*Info, error) {
	for {
		in, err := m.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		if !in.Status.Active() {
			m.waitShim(&in.State, 5*time.Second)
			return m.Get(ctx, name)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
