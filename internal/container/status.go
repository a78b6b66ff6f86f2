package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Info is a container's state as shown to users.
type Info struct {
	State
	Name   string `json:"name"`
	Status string `json:"status"` // running, paused, exited, checkpointed, created, stopped
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

// Get returns a container's current state.
func (m *Manager) Get(ctx context.Context, name string) (*Info, error) {
	st, err := m.loadState(name)
	if err != nil {
		return nil, err
	}
	dir := m.dir(name)
	in := m.info(name, st)
	rs, err := m.runc.state(ctx, m.runcID(name))
	if err == nil && rs.Status == "paused" {
		m.recoverFreeze(ctx, st, rs.Pid)
		rs, err = m.runc.state(ctx, m.runcID(name))
	}
	switch {
	case err == nil && rs.Status != "stopped":
		in.Status, in.Pid = rs.Status, rs.Pid
		return in, nil
	case err != nil && !errors.Is(err, errNoRuncContainer):
		return nil, err
	}
	in.Status = "stopped"
	if e, err := readExit(dir); err == nil {
		in.Exit = e
		in.Status = "exited"
	} else if shimRuns(st.ShimPID) {
		// The init is gone but its shim is still draining the output and
		// writing exit.json: not stopped, about to be exited.
		in.Status = "exiting"
	}
	if st.Checkpointed {
		in.Status = "checkpointed"
	}
	return in, nil
}

// List returns every container of the data dir, by name.
func (m *Manager) List(ctx context.Context) ([]*Info, error) {
	ents, err := os.ReadDir(filepath.Join(m.opts.DataDir, "containers"))
	if err != nil {
		return nil, err
	}
	var out []*Info
	for _, e := range ents {
		in, err := m.Get(ctx, e.Name())
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

// Wait blocks until the container is no longer running and returns how it
// ended.
func (m *Manager) Wait(ctx context.Context, name string) (*Info, error) {
	for {
		in, err := m.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		if in.Status != "running" && in.Status != "paused" && in.Status != "created" {
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
