package testbed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cairn-hpc/cairn/internal/netw"
)

// What runs on a node, as a machine: the processes in its network
// namespace or in its ranks', and the cgroups of its containers.

// processes returns the processes that run on the node: in its network
// namespace (its agent and what the agent started) or in one of its
// ranks' (named after the node: "NODE-j...").
func (n Node) processes() []int {
	inodes := map[uint64]bool{}
	add := func(path string) {
		var st syscall.Stat_t
		if syscall.Stat(path, &st) == nil {
			inodes[st.Ino] = true
		}
	}
	add(netw.NetnsPath(n.Name))
	if ents, err := os.ReadDir(netw.NetnsDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), n.Name+"-") {
				add(netw.NetnsPath(e.Name()))
			}
		}
	}
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == os.Getpid() {
			continue
		}
		link, err := os.Readlink(filepath.Join(p, "ns", "net")) // "net:[INODE]"
		if err != nil {
			continue
		}
		ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "net:["), "]"), 10, 64)
		if err == nil && inodes[ino] {
			pids = append(pids, pid)
		}
	}
	return pids
}

// signal sends sig to every process of pids.
func signal(pids []int, sig syscall.Signal) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, sig)
	}
}

// waitKilled waits until the killed processes pids of node have exited,
// thawing the cgroup of any that a freezer holds (a rank frozen for a
// checkpoint dies only once thawed).
func waitKilled(node string, pids []int) error {
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for thawed := false; Running(pid); {
			if time.Now().After(deadline) {
				return fmt.Errorf("node %s: process %d still runs 10s after SIGKILL", node, pid)
			}
			if !thawed && time.Now().After(deadline.Add(-9*time.Second)) {
				thaw(pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				thawed = true
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// thaw thaws the freezer cgroup of process pid (cgroup v1's freezer
// hierarchy, or v2's cgroup.freeze), if it has one.
func thaw(pid int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3) // "ID:CONTROLLERS:PATH"
		if len(f) != 3 {
			continue
		}
		switch {
		case f[1] == "freezer":
			_ = os.WriteFile(filepath.Join("/sys/fs/cgroup/freezer", f[2], "freezer.state"), []byte("THAWED"), 0)
		case f[0] == "0" && f[1] == "":
			_ = os.WriteFile(filepath.Join("/sys/fs/cgroup", f[2], "cgroup.freeze"), []byte("0"), 0)
			_ = os.WriteFile(filepath.Join("/sys/fs/cgroup/unified", f[2], "cgroup.freeze"), []byte("0"), 0)
		}
	}
}

// removeCgroups removes the cgroups of the containers of the Manager
// instance inst, in every hierarchy ("/sys/fs/cgroup/HIERARCHY/cairn-INST-NAME",
// or directly under /sys/fs/cgroup with cgroup v2), nested ones first.
// A cgroup is busy until the processes killed in it are reaped: it is
// tried again for a few seconds.
func removeCgroups(inst string) error {
	if inst == "" {
		return nil
	}
	var tops []string
	for _, pattern := range []string{"/sys/fs/cgroup/cairn-" + inst + "-*", "/sys/fs/cgroup/*/cairn-" + inst + "-*"} {
		m, _ := filepath.Glob(pattern)
		tops = append(tops, m...)
	}
	var dirs []string
	for _, top := range tops {
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- { // children after their parents, so removed first
		for {
			err := os.Remove(dirs[i])
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}
