package criu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultPath is where `make setup` installs CRIU.
const DefaultPath = "/opt/cairn/bin/criu"

// EnvPath names the environment variable that overrides the CRIU binary.
const EnvPath = "CAIRN_CRIU"

// install says how to get a CRIU cairn can use.
const install = "install CRIU 4.2 or newer with `make setup` in cairn's source, or /usr/share/cairn/install-criu where cairn came from its package (both build it into " + DefaultPath + "), or set $" + EnvPath

// MinVersion is the oldest CRIU that works on the kernels cairn targets.
var MinVersion = Version{4, 2, 0}

// ErrUnusable is returned by Check when CRIU is missing, too old, or fails
// `criu check`. The error text says which and what to do.
var ErrUnusable = errors.New("criu unusable")

// Version is a CRIU release number.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less reports whether v is older than w.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

// ParseVersion reads the output of `criu --version` ("Version: 4.2.1").
func ParseVersion(out string) (Version, error) {
	for _, line := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:")
		if !ok {
			continue
		}
		parts := strings.SplitN(strings.TrimSpace(rest), ".", 3)
		var v Version
		for i, dst := range []*int{&v.Major, &v.Minor, &v.Patch} {
			if i >= len(parts) {
				break
			}
			n, err := strconv.Atoi(strings.TrimFunc(parts[i], func(r rune) bool { return r < '0' || r > '9' }))
			if err != nil {
				return Version{}, fmt.Errorf("parse criu version %q: %w", rest, err)
			}
			*dst = n
		}
		return v, nil
	}
	return Version{}, fmt.Errorf("no Version line in criu --version output %q", out)
}

// Find returns the CRIU binary to use: explicit if non-empty, else
// $CAIRN_CRIU, else DefaultPath if it exists, else criu on PATH.
func Find(explicit string) (string, error) {
	for _, p := range []string{explicit, os.Getenv(EnvPath)} {
		if p != "" {
			abs, err := filepath.Abs(p)
			if err != nil {
				return "", err
			}
			return abs, nil
		}
	}
	if _, err := os.Stat(DefaultPath); err == nil {
		return DefaultPath, nil
	}
	p, err := exec.LookPath("criu")
	if err != nil {
		return "", fmt.Errorf("%w: no CRIU at %s or on PATH; %s", ErrUnusable, DefaultPath, install)
	}
	return p, nil
}

// Info describes a checked CRIU binary.
type Info struct {
	Path    string  `json:"path"`
	Version Version `json:"version"`
}

// Check verifies that the binary at path is CRIU MinVersion or newer and that
// `criu check` passes on this kernel.
func Check(ctx context.Context, path string) (Info, error) {
	info := Info{Path: path}
	out, err := exec.CommandContext(ctx, path, "--version").CombinedOutput()
	if err != nil {
		return info, fmt.Errorf("%w: run %s --version: %v: %s", ErrUnusable, path, err, bytes.TrimSpace(out))
	}
	v, err := ParseVersion(string(out))
	if err != nil {
		return info, fmt.Errorf("%w: %v", ErrUnusable, err)
	}
	info.Version = v
	if v.Less(MinVersion) {
		return info, fmt.Errorf("%w: %s is CRIU %s, cairn needs %s or newer on this kernel (older releases cannot dump TCP sockets or fail `criu check`); %s",
			ErrUnusable, path, v, MinVersion, install)
	}
	out, err = exec.CommandContext(ctx, path, "check").CombinedOutput()
	if err != nil {
		return info, fmt.Errorf("%w: `%s check` failed: %s", ErrUnusable, path, LastErrors(out, 3))
	}
	return info, nil
}

// advice says what to do about errors CRIU prints for things cairn cannot
// checkpoint: a part of CRIU's message, and what to add to it.
var advice = []struct{ msg, what string }{
	// fsnotify.c, for an inotify or fanotify watch whose file CRIU found
	// neither by handle nor by walking the container's directories.
	// CRIU reads each task's rlimits with prlimit, which needs
	// CAP_SYS_RESOURCE for a task of another uid.
	{"Can't get rlimit", "this node's root lacks CAP_SYS_RESOURCE (see `cairn check`), so processes of another user than root cannot be dumped: give the agent that capability (docs/limits.md)"},
	{"Can't dump that handle", "a process watches (inotify) a file that no path in the container leads to, such as one deleted while still open: remove the watch (inotify_rm_watch) before the checkpoint"},
}

// LastErrors returns the last n "Error" lines of a CRIU log, joined by "; ",
// without CRIU's timestamps. Errors CRIU is known to print harmlessly on
// these kernels (RLIMIT_NOFILE for self) are skipped; errors whose cause
// cairn knows are followed by what to do, in parentheses. If there are
// none it returns the last non-empty line.
func LastErrors(log []byte, n int) string {
	var errs []string
	var last string
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		last = line
		if i := strings.Index(line, "Error ("); i >= 0 {
			msg := line[i:]
			if strings.Contains(msg, "RLIMIT_NOFILE for self") {
				continue
			}
			// "Error (criu/files-reg.c:1790): Can't lookup ..." -> keep the message.
			if j := strings.Index(msg, "): "); j >= 0 {
				msg = msg[j+3:]
			}
			msg = strings.Join(strings.Fields(msg), " ")
			for _, a := range advice {
				if strings.Contains(msg, a.msg) {
					msg += " (" + a.what + ")"
				}
			}
			if len(errs) == 0 || errs[len(errs)-1] != msg {
				errs = append(errs, msg)
			}
		}
	}
	if len(errs) == 0 {
		return last
	}
	if len(errs) > n {
		errs = errs[len(errs)-n:]
	}
	return strings.Join(errs, "; ")
}
