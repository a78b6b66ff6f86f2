package container

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cairn-hpc/cairn/internal/proc"
)

// runc drives the runc CLI with cairn's own state root and CRIU.
type runc struct {
	bin  string // runc binary
	root string // runc --root
	criu string // CRIU binary, passed with --criu and first on PATH
}

// argv returns the full command line for a runc subcommand, logging runc's
// own messages as JSON into logPath (if not empty).
func (r runc) argv(logPath string, args ...string) []string {
	a := []string{r.bin, "--root", r.root}
	if logPath != "" {
		a = append(a, "--log", logPath, "--log-format", "json")
	}
	if r.criu != "" {
		a = append(a, "--criu", r.criu)
	}
	return append(a, args...)
}

// env puts CRIU's directory first on PATH: runc releases that ignore
// --criu run the criu found there.
func (r runc) env() []string {
	env := os.Environ()
	if r.criu == "" {
		return env
	}
	for i, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			env[i] = "PATH=" + filepath.Dir(r.criu) + ":" + v
			return env
		}
	}
	return append(env, "PATH="+filepath.Dir(r.criu)+":/usr/sbin:/usr/bin:/sbin:/bin")
}

// run runs a runc subcommand that needs no stdio and returns its error with
// runc's message.
func (r runc) run(ctx context.Context, logPath string, args ...string) error {
	return r.runNotify(ctx, logPath, nil, args...)
}

// runNotify is run, calling started with runc's pid once it runs.
func (r runc) runNotify(ctx context.Context, logPath string, started func(pid int) error, args ...string) error {
	a := r.argv(logPath, args...)
	cmd := exec.CommandContext(ctx, a[0], a[1:]...)
	cmd.Env = r.env()
	// In a process group of its own: a terminal's Ctrl-C reaches cairn,
	// which decides, not a CRIU in the middle of a dump.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Cancelled, runc's children go first: CRIU holds the container's
	// processes, and killing runc alone would leave it running.
	cmd.Cancel = func() error {
		for _, c := range proc.Children(cmd.Process.Pid) {
			_ = syscall.Kill(c, syscall.SIGKILL)
		}
		return cmd.Process.Kill()
	}
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Start()
	if err == nil && started != nil {
		if err = started(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return err
		}
	}
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if logPath != "" {
			if m := lastRuncError(logPath); m != "" {
				return fmt.Errorf("runc %s: %s", args[0], tidyRuncMessage(m))
			}
		}
		return fmt.Errorf("runc %s: %s", args[0], runcMessage(msg, err))
	}
	return nil
}

// tidyRuncMessage drops runc's pointer to the CRIU log (cairn reports the
// log's errors itself) and joins the remaining lines.
func tidyRuncMessage(m string) string {
	var keep []string
	for _, l := range strings.Split(strings.ReplaceAll(m, `\n`, "\n"), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "log file:") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "; ")
}

func runcMessage(msg string, err error) string {
	if msg == "" {
		return err.Error()
	}
	// runc prints `time="..." level=error msg="..."`; keep the msg.
	if i := strings.LastIndex(msg, `msg="`); i >= 0 {
		m := msg[i+5:]
		if j := strings.LastIndex(m, `"`); j >= 0 {
			m = m[:j]
		}
		return tidyRuncMessage(m)
	}
	return tidyRuncMessage(msg)
}

// lastRuncError returns the last error message in a runc JSON log.
func lastRuncError(logPath string) string {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var e struct{ Level, Msg string }
		if json.Unmarshal(lines[i], &e) == nil && (e.Level == "error" || e.Level == "fatal") {
			return e.Msg
		}
	}
	return ""
}

// runcState is the part of `runc state` output cairn reads.
type runcState struct {
	Status Status `json:"status"` // created, running, paused, stopped
	Pid    int    `json:"pid"`
}

var errNoRuncContainer = errors.New("runc does not know the container")

// runcSaved is the part of runc's saved state of a container
// (<root>/<id>/state.json, libcontainer's State) that its status comes
// from.
type runcSaved struct {
	InitPid     int               `json:"init_process_pid"`
	InitStart   uint64            `json:"init_process_start"`
	CgroupPaths map[string]string `json:"cgroup_paths"`
}

// state is what `runc state` says of container id, worked out as runc
// does from the state runc saved, without starting a runc: every
// checkpoint asks before the freeze, and a runc start costs several
// milliseconds on an idle node and tens under the load of other ranks'
// dumps. As in runc: paused if the container's freezer has frozen it
// (its own, not an ancestor's); stopped if its init is gone (no such
// process, one started at another time, or a zombie), and then with pid
// 0; created while runc's exec FIFO is there (made by runc create,
// removed by runc start); running otherwise.
// TestRuncState holds it to `runc state`.
func (r runc) state(ctx context.Context, id string) (runcState, error) {
	if err := ctx.Err(); err != nil {
		return runcState{}, err
	}
	dir := filepath.Join(r.root, id)
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return runcState{}, errNoRuncContainer
	}
	if err != nil {
		return runcState{}, fmt.Errorf("runc state %s: %w", id, err)
	}
	var saved runcSaved
	if err := json.Unmarshal(b, &saved); err != nil {
		return runcState{}, fmt.Errorf("runc state %s: %w", id, err)
	}
	paused, err := cgroupFrozen(saved.CgroupPaths)
	if err != nil {
		return runcState{}, fmt.Errorf("runc state %s: %w", id, err)
	}
	if paused {
		return runcState{Status: StatusPaused, Pid: saved.InitPid}, nil
	}
	if st, start, err := proc.Started(saved.InitPid); err != nil || start != saved.InitStart || st == 'Z' || st == 'X' {
		return runcState{Status: StatusStopped}, nil
	}
	if _, err := os.Lstat(filepath.Join(dir, "exec.fifo")); err == nil {
		return runcState{Status: StatusCreated, Pid: saved.InitPid}, nil
	}
	return runcState{Status: StatusRunning, Pid: saved.InitPid}, nil
}

// cgroupFrozen reports whether the freezer of a container's cgroups
// (runc's cgroup_paths) has frozen it, as runc tells: with cgroup v1, its
// freezer.state is FROZEN by its own freezer.self_freezing (FREEZING is
// read again until it settles); with cgroup v2 only, its cgroup.freeze is
// 1. A container whose cgroup is gone is not frozen.
func cgroupFrozen(paths map[string]string) (bool, error) {
	if dir, ok := paths["freezer"]; ok {
		for try := 0; ; try++ {
			b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
			if errors.Is(err, fs.ErrNotExist) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			switch state := strings.TrimSpace(string(b)); {
			case state == "THAWED":
				return false, nil
			case state == "FROZEN":
				self, err := os.ReadFile(filepath.Join(dir, "freezer.self_freezing"))
				if err != nil {
					return true, nil // an old kernel without it
				}
				return strings.TrimSpace(string(self)) == "1", nil
			case state == "FREEZING" && try < 1000:
				time.Sleep(time.Millisecond)
			default:
				return false, fmt.Errorf("freezer state %q", state)
			}
		}
	}
	dir, ok := paths[""]
	if !ok {
		return false, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.freeze"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) == "1", nil
}
