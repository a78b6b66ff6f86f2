package criu_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/criu"
)

func TestParseVersion(t *testing.T) {
	tests := []struct {
		in   string
		want criu.Version
		ok   bool
	}{
		{"Version: 4.2.1\n", criu.Version{4, 2, 1}, true},
		{"Version: 3.17.1\nGitID: v3.17.1\n", criu.Version{3, 17, 1}, true},
		{"Version: 4.2\n", criu.Version{4, 2, 0}, true},
		{"nothing here", criu.Version{}, false},
		{"Version: x.y", criu.Version{}, false},
	}
	for _, tc := range tests {
		got, err := criu.ParseVersion(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	if !(criu.Version{4, 1, 1}).Less(criu.MinVersion) || (criu.Version{4, 2, 1}).Less(criu.MinVersion) {
		t.Error("Less does not order versions")
	}
}

func TestLastErrors(t *testing.T) {
	log := []byte(`(00.04) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.05) Error (criu/files-reg.c:1790): Can't lookup mount=27 for fd=1 path=/tmp/out
(00.06) Error (criu/cr-dump.c:1975): Dumping FAILED.
`)
	got := criu.LastErrors(log, 5)
	want := "Can't lookup mount=27 for fd=1 path=/tmp/out; Dumping FAILED."
	if got != want {
		t.Errorf("LastErrors = %q, want %q", got, want)
	}
}

// TestCheckRefusesOldCRIU runs Check against a fake binary that reports an
// old version: the error must say why and what to do, without running
// `criu check`.
func TestCheckRefusesOldCRIU(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "criu")
	script := "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Version: 3.17.1'; exit 0; fi\necho ran-check >&2; exit 1\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := criu.Check(context.Background(), fake)
	if !errors.Is(err, criu.ErrUnusable) {
		t.Fatalf("Check(old) = %v, want ErrUnusable", err)
	}
	for _, s := range []string{"3.17.1", "4.2.0", "make setup"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestCheckInstalled(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	path, err := criu.Find("")
	if err != nil {
		t.Fatal(err)
	}
	info, err := criu.Check(context.Background(), path)
	if err != nil {
		t.Fatalf("installed CRIU unusable: %v", err)
	}
	if info.Version.Less(criu.MinVersion) {
		t.Fatalf("version %v", info.Version)
	}
}
