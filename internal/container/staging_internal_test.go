package container

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestRestoreUpperLeftovers: the new upper dir of a restore whose process
// died (an agent killed mid-restore) is neither listed as a container nor
// kept; one of a live process stays.
func TestRestoreUpperLeftovers(t *testing.T) {
	data := t.TempDir()
	m := &Manager{opts: Options{DataDir: data, StagingDir: t.TempDir()}}
	containers := filepath.Join(data, "containers")
	dead := filepath.Join(containers, fmt.Sprintf("%sring.1-pid%d-123", restoreUpperPrefix, deadPID(t)))
	live := filepath.Join(containers, fmt.Sprintf("%sring.2-pid%d-456", restoreUpperPrefix, os.Getpid()))
	for _, d := range []string{filepath.Join(containers, "ring.0"), filepath.Join(dead, "etc"), live} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	names, err := m.names()
	if err != nil || !slices.Equal(names, []string{"ring.0"}) {
		t.Fatalf("names %v, %v; want only ring.0", names, err)
	}
	m.cleanStaging()
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead restore's upper dir is still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live restore's upper dir: %v", err)
	}
}

// deadPID is the pid of a process that has ended.
func deadPID(t *testing.T) int {
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	return p.Pid
}
