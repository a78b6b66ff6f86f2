package container_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// pidsFile reads a file of a container's pids cgroup (v1 or v2).
func pidsFile(t *testing.T, in *container.Info, name string) string {
	t.Helper()
	for _, dir := range []string{
		filepath.Join("/sys/fs/cgroup/pids", in.CgroupsPath),
		filepath.Join("/sys/fs/cgroup", in.CgroupsPath),
	} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("no %s for %s", name, in.CgroupsPath)
	return ""
}

// TestPidsLimit: a container's processes and threads are bounded, by
// default too, so that a fork bomb inside one fails there: forks past the
// limit are refused, the container and its node go on.
func TestPidsLimit(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	for _, tc := range []struct {
		name  string
		limit int64
		want  string
	}{
		{"default", 0, strconv.Itoa(container.DefaultPidsLimit)},
		{"none", -1, "max"},
		{"small", 16, "16"},
	} {
		in, err := m.Run(ctx, container.Config{Name: "p" + tc.name, PidsLimit: tc.limit, Args: []string{"sleep", "1000"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := pidsFile(t, in, "pids.max"); got != tc.want {
			t.Errorf("%s: pids.max %s, want %s", tc.name, got, tc.want)
		}
	}
	in, err := m.Get(ctx, "psmall")
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code, err := m.Exec(ctx, "psmall", []string{"sh", "-c", "for i in $(seq 40); do sleep 1000 >/dev/null 2>&1 & done; echo all forked"}, nil, &out, &errb)
	if err != nil || code == 0 || strings.Contains(out.String(), "all forked") {
		t.Fatalf("40 forks under a limit of 16: exit %d, %v, out %q, err %q; want refused", code, err, out.String(), errb.String())
	}
	if n, _ := strconv.Atoi(pidsFile(t, in, "pids.current")); n > 16 || n < 2 {
		t.Errorf("pids.current %d under a limit of 16", n)
	}
	if in, err := m.Get(ctx, "psmall"); err != nil || in.Status != container.StatusRunning {
		t.Errorf("after the fork bomb the container is %v (%v), want running", in, err)
	}
}

// TestRestoredInItsCgroups: CRIU leaves cgroups to runc (its config says
// manage-cgroups=ignore, which it takes only in that spelling): the image
// holds no cgroups of CRIU's, and the restored processes are in the
// container's cgroups, every controller's, under the limits runc set.
func TestRestoredInItsCgroups(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in, err := m.Run(ctx, container.Config{Name: "cg", PidsLimit: 64, Args: []string{"sh", "-c", "sleep 1000 & sleep 1000 & wait"}})
	if err != nil {
		t.Fatal(err)
	}
	// The hierarchies the host mounts that runc put the container in.
	// A controller mounted elsewhere only (the net_cls hierarchy the
	// tests' link cutter mounts in a namespace of its own, testutil's
	// cut.go) has every process in its root; it is not the container's.
	own := ownHierarchies(t, in.Pid, in.CgroupsPath)
	if len(own) < 2 {
		t.Fatalf("the container is in %d cgroup hierarchies of its own: %v", len(own), own)
	}
	rec, err := m.Checkpoint(ctx, "cg", container.CheckpointOptions{Stop: true})
	if err != nil {
		t.Fatal(err)
	}
	criuDir := t.TempDir()
	if err := m.Repo().Materialize(ctx, rec, criuDir, t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	// CRIU still names each task's cgroups, but dumps no cgroup's
	// settings (cgroup.procs is among those of every cgroup it does).
	img, err := os.ReadFile(filepath.Join(criuDir, "cgroup.img"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if bytes.Contains(img, []byte("cgroup.procs")) {
		t.Errorf("the image holds the settings of the container's cgroups (%d bytes of cgroup.img): CRIU did not take manage-cgroups=ignore", len(img))
	}
	in, err = m.Restore(ctx, "cg", container.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	procs := strings.Fields(pidsFile(t, in, "cgroup.procs"))
	if len(procs) != 3 { // sh and its two sleeps
		t.Errorf("restored cgroup.procs %v, want 3 processes", procs)
	}
	for _, pid := range procs {
		n, _ := strconv.Atoi(pid)
		if got := ownHierarchies(t, n, in.CgroupsPath); !slices.Equal(got, own) {
			t.Errorf("restored pid %s is in the container's cgroups of %v, want %v", pid, got, own)
		}
	}
	if got := pidsFile(t, in, "pids.max"); got != "64" {
		t.Errorf("restored pids.max %s, want 64", got)
	}
}

// ownHierarchies lists the cgroup hierarchies the host mounts under
// /sys/fs/cgroup (their controllers, as /proc/PID/cgroup names them) in
// which pid is in the cgroup at path.
func ownHierarchies(t *testing.T, pid int, path string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	var own []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 || parts[2] != path {
			continue
		}
		if dir := strings.TrimPrefix(parts[1], "name="); dir != "" {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", dir)); err != nil {
				continue
			}
		}
		own = append(own, parts[1])
	}
	slices.Sort(own)
	return own
}
