package container

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// RuncStates returns container name's state as cairn works it out from
// what runc saved, and as `runc state` prints it, each as "status pid"
// ("absent" if runc does not know the container).
func RuncStates(ctx context.Context, m *Manager, name string) (got, want string, err error) {
	return RuncStatesOf(ctx, m, m.runcID(name))
}

// RuncDir is the directory of runc's saved state of container name.
func RuncDir(m *Manager, name string) string { return filepath.Join(m.runc.root, m.runcID(name)) }

// RuncStatesOf is RuncStates for runc's container id.
func RuncStatesOf(ctx context.Context, m *Manager, id string) (got, want string, err error) {
	show := func(s runcState, err error) (string, error) {
		switch {
		case err == errNoRuncContainer:
			return "absent", nil
		case err != nil:
			return "", err
		}
		return fmt.Sprintf("%s %d", s.Status, s.Pid), nil
	}
	if got, err = show(m.runc.state(ctx, id)); err != nil {
		return "", "", err
	}
	a := m.runc.argv("", "state", id)
	cmd := exec.CommandContext(ctx, a[0], a[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil && strings.Contains(stderr.String(), "does not exist") {
		return got, "absent", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("runc state: %v: %s", err, stderr.String())
	}
	var s runcState
	if err := json.Unmarshal(out, &s); err != nil {
		return "", "", err
	}
	want, err = show(s, nil)
	return got, want, err
}
