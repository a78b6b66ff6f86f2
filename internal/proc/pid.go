package proc

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// stat is what cairn reads of /proc/PID/stat.
type stat struct {
	comm  string
	state byte // R, S, D, T (stopped), t (stopped by its tracer), Z (zombie), ...
	ppid  int
	start uint64 // clock ticks after boot; 0 if the line stops short of it
}

var errNoPID = errors.New("no such process")

// readStat reads /proc/PID/stat. The command name, in parentheses, may
// hold spaces and parentheses itself: the fields that follow are found
// after its last ')'.
func readStat(pid int) (stat, error) {
	if pid <= 0 {
		return stat{}, errNoPID
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	return parseStat(b)
}

func parseStat(b []byte) (stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, errors.New("malformed stat")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 || len(f[0]) == 0 {
		return stat{}, errors.New("malformed stat")
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return stat{}, errors.New("malformed stat")
	}
	st := stat{state: f[0][0], ppid: ppid}
	// f[0] is the line's third field: starttime, the 22nd, is f[19].
	if len(f) > 19 {
		if st.start, err = strconv.ParseUint(string(f[19]), 10, 64); err != nil {
			return stat{}, errors.New("malformed stat")
		}
	}
	if j := bytes.IndexByte(b, '('); j >= 0 && j < i {
		st.comm = string(b[j+1 : i])
	}
	return st, nil
}

// State returns pid's state, as /proc/PID/stat gives it (R, S, D, T for
// stopped by a signal, t for stopped by its tracer, Z, ...), and its
// command name.
func State(pid int) (state byte, comm string, err error) {
	st, err := readStat(pid)
	return st.state, st.comm, err
}

// Started returns pid's state (as State gives it) and when it started,
// in clock ticks after boot (/proc/PID/stat's starttime): with the pid,
// the start names one process, since a pid is used again only by a
// process started later.
func Started(pid int) (state byte, start uint64, err error) {
	st, err := readStat(pid)
	if err == nil && st.start == 0 {
		err = errors.New("malformed stat: no start time")
	}
	return st.state, st.start, err
}

// StatusField returns the value of key (a field name such as "NSpid",
// without its colon) in /proc/PID/status, trimmed; pid 0 is this process.
// ok is false if the process or the field is not there.
func StatusField(pid int, key string) (value string, ok bool) {
	p := "self"
	if pid != 0 {
		p = strconv.Itoa(pid)
	}
	b, err := os.ReadFile("/proc/" + p + "/status")
	if err != nil {
		return "", false
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, found := bytes.CutPrefix(line, []byte(key+":")); found {
			return string(bytes.TrimSpace(v)), true
		}
	}
	return "", false
}

// Runs reports whether pid is a process that has not ended: it exists
// and is not a zombie (ended, and not yet reaped by its parent).
// kill(pid, 0) cannot tell a zombie from a live process: both take the
// signal. A pid of 0 or less is no process.
//
// /proc/PID/stat is the state of the process's first thread, which turns
// zombie as soon as it has exited itself: a multi-threaded process that
// was killed shows Z while its other threads are still tearing down and
// still hold its files (a listening socket, a lock). The process has
// ended when its first thread is a zombie and no other thread is left.
func Runs(pid int) bool {
	st, err := readStat(pid)
	if err != nil {
		return false
	}
	return st.state != 'Z' || threadsLeft(pid) > 1
}

// threadsLeft counts the threads of pid that have not been released: a
// zombie first thread stays listed until it is reaped.
func threadsLeft(pid int) int {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return 0
	}
	return len(ents)
}

// Parent returns the pid of pid's parent, 0 if pid is no process.
func Parent(pid int) int {
	st, err := readStat(pid)
	if err != nil {
		return 0
	}
	return st.ppid
}

// Children returns the children of the given processes that have not
// ended (zombies left out), in /proc's order.
func Children(parents ...int) []int {
	if len(parents) == 0 {
		return nil
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		st, err := parseStat(b)
		if err != nil || st.state == 'Z' || !slices.Contains(parents, st.ppid) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			out = append(out, pid)
		}
	}
	return out
}
