package container

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"cairn/internal/criu"
)

// HostCheck is one thing a node needs to run and checkpoint containers.
type HostCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"` // what was found, or why it is no good
}

// CheckHost checks what this node needs to run and checkpoint containers:
// CRIU (found as criu.Find finds criuPath, and `criu check` passing), the
// runc binary runcPath, ip and iptables.
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
	return out
}
