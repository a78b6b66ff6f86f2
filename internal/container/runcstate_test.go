package container_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestRuncState: the state cairn works out from what runc saved is what
// `runc state` prints, through a container's life: unknown, running,
// paused (by cairn's freezer), running again, gone, created (a files-only
// restore waiting for Resume) and running once resumed; and for a saved
// state whose init is another process now (same pid, another start) or
// none: stopped, with pid 0.
func TestRuncState(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	check := func(what, name, status string) {
		t.Helper()
		got, want, err := container.RuncStates(ctx, m, name)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got != want {
			t.Errorf("%s: cairn reads %q, runc state says %q", what, got, want)
		}
		if s, _, _ := strings.Cut(want, " "); s != status {
			t.Errorf("%s: runc state says %q, want %s", what, want, status)
		}
	}
	check("before it runs", "s", "absent")
	if _, err := m.Run(ctx, container.Config{Name: "s", Args: []string{"sleep", "1000"}}); err != nil {
		t.Fatal(err)
	}
	check("run", "s", "running")
	if err := m.Pause(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	check("paused", "s", "paused")
	if err := m.Resume(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	check("resumed", "s", "running")

	// A saved state of another container id, whose init is not the
	// process it names, or no process at all.
	root := filepath.Dir(container.RuncDir(m, "s"))
	b, err := os.ReadFile(filepath.Join(container.RuncDir(m, "s"), "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id    string
		patch func(map[string]any)
	}{
		{"ghost-start", func(s map[string]any) { s["init_process_start"] = s["init_process_start"].(float64) + 1 }},
		{"ghost-pid", func(s map[string]any) { s["init_process_pid"] = 1 << 22 }},
	} {
		var s map[string]any
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		s["id"] = tc.id
		tc.patch(s)
		out, _ := json.Marshal(s)
		dir := filepath.Join(root, tc.id)
		if err := os.Mkdir(dir, 0o711); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		if err := os.WriteFile(filepath.Join(dir, "state.json"), out, 0o600); err != nil {
			t.Fatal(err)
		}
		got, want, err := container.RuncStatesOf(ctx, m, tc.id)
		if err != nil || got != want || want != "stopped 0" {
			t.Errorf("%s: cairn reads %q, runc state says %q (%v); want both stopped 0", tc.id, got, want, err)
		}
	}

	// Gone, then made again from a files-only checkpoint, paused.
	p, err := m.Prepare(ctx, "s", 0, container.PrepareOptions{FilesOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	check("prepared", "s", "paused")
	rec, err := p.Commit(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(ctx, "s", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Wait(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	got, want, err := container.RuncStates(ctx, m, "s")
	if err != nil || got != want {
		t.Errorf("ended: cairn reads %q, runc state says %q (%v)", got, want, err)
	}
	if _, err := m.Restore(ctx, "s", container.RestoreOptions{Seq: rec.Seq, Paused: true}); err != nil {
		t.Fatal(err)
	}
	check("restored, waiting for Resume", "s", "created")
	if err := m.Resume(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	check("started", "s", "running")
}
