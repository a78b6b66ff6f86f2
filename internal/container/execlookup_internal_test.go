package container

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestExecLookup: a command is found as runc exec finds it, inside the
// process's root (this test's own: the host's): a path from the working
// directory, or the first executable file of that name on PATH; one that
// is there but not executable anywhere is told apart from one that is
// nowhere.
func TestExecLookup(t *testing.T) {
	dir := t.TempDir()
	for name, mode := range map[string]os.FileMode{"a/tool": 0o644, "b/tool": 0o755, "a/plain": 0o644, "prog": 0o755} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	pid := os.Getpid()
	env := []string{"PATH=" + filepath.Join(dir, "a") + ":" + filepath.Join(dir, "b")}
	for _, tc := range []struct {
		env      []string
		cwd, cmd string
		want     error
	}{
		{env, "/", "tool", nil},                   // b's, after a's that is not executable
		{env, "/", "plain", ErrExecNotExecutable}, // only a's, not executable
		{env, "/", "nowhere", ErrExecNotFound},    // none
		{nil, "/", "sh", nil},                     // the default PATH
		{env, dir, "./prog", nil},                 // from the working directory
		{env, dir, "./nowhere", ErrExecNotFound},  //
		{env, "/", filepath.Join(dir, "a/plain"), ErrExecNotExecutable},
		{env, "/", dir, ErrExecNotExecutable}, // a directory
	} {
		err := execLookup(pid, tc.env, tc.cwd, tc.cmd)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("lookup of %s from %s: %v, want %v", tc.cmd, tc.cwd, err, tc.want)
		}
	}
}
