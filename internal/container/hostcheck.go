package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/cairn-hpc/cairn/internal/criu"
	"github.com/cairn-hpc/cairn/internal/proc"
)

// HostCheck is one thing a node needs to run and checkpoint containers.
type HostCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"` // what was found, or why it is no good
	// Limit marks a check that is OK but found something that limits
	// what can be checkpointed on this node (Detail says what).
	Limit bool `json:"limit,omitempty"`
}

// CheckHost checks what this node needs to run and checkpoint containers:
// CRIU (found as criu.Find finds criuPath, and `criu check` passing), the
// runc binary runcPath, ip and iptables, time namespaces, and the
// capabilities CRIU needs.
func CheckHost(ctx context.Context, criuPath, runcPath string) []HostCheck {
	var out []HostCheck
	add := func(name string, err error, detail string) {
		c := HostCheck{Name: name, OK: err == nil, Detail: detail}
		if err != nil {
			c.Detail = err.Error()
		}
		out = append(out, c)
	}
	path, err := criu.Find(criuPath)
	if err == nil {
		var info criu.Info
		info, err = criu.Check(ctx, path)
		add("criu", err, fmt.Sprintf("%s at %s, `criu check` passed", info.Version, path))
	} else {
		add("criu", err, "")
	}
	version, err := exec.CommandContext(ctx, runcPath, "--version").Output()
	add("runc", err, strings.SplitN(string(version), "\n", 2)[0])
	for _, tool := range []string{"ip", "iptables"} {
		p, err := exec.LookPath(tool)
		add(tool, err, p)
	}
	if _, err := os.Stat("/proc/self/ns/time"); err != nil {
		out = append(out, HostCheck{Name: "clocks", OK: true, Limit: true,
			Detail: "no time namespaces in this kernel (CONFIG_TIME_NS): a rank restored here from a host booted earlier sees CLOCK_MONOTONIC go back (docs/limits.md, \"Clocks\")"})
	} else {
		add("clocks", nil, "time namespaces: a restored rank's monotonic and boot-time clocks go on from where they were, on a host of any uptime")
	}
	if err := BoundingCaps(); err != nil {
		out = append(out, HostCheck{Name: "caps", OK: true, Limit: true, Detail: err.Error()})
	} else {
		add("caps", nil, "CAP_SYS_RESOURCE in the bounding set: processes of every user can be dumped")
	}
	return out
}

// capSysResource is CAP_SYS_RESOURCE's bit (linux/capability.h).
const capSysResource = 24

// BoundingCaps checks that this process's capability bounding set holds
// what CRIU needs beyond root: without CAP_SYS_RESOURCE it cannot read the
// rlimits of a process of another user (prlimit), and the dump of any
// container that runs one fails with "Can't get rlimit" (docs/limits.md).
func BoundingCaps() error {
	v, ok := proc.StatusField(0, "CapBnd")
	if !ok {
		return errors.New("no CapBnd in /proc/self/status")
	}
	set, err := strconv.ParseUint(v, 16, 64)
	if err != nil {
		return fmt.Errorf("CapBnd %q: %w", v, err)
	}
	if set&(1<<capSysResource) == 0 {
		return errors.New("CAP_SYS_RESOURCE is not in this root's bounding set: a checkpoint of a container running a process of another user than root (PostgreSQL, which refuses root, is one) fails with CRIU's \"Can't get rlimit\"; run cairn with that capability (docs/limits.md)")
	}
	return nil
}
