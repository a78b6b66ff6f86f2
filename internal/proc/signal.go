package proc

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
)

// signals are the signals ParseSignal knows by name.
var signals = map[string]syscall.Signal{"KILL": syscall.SIGKILL, "TERM": syscall.SIGTERM, "INT": syscall.SIGINT,
	"HUP": syscall.SIGHUP, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT, "QUIT": syscall.SIGQUIT}

// ParseSignal reads a signal as a number (1-64) or a name, with or
// without "SIG" (KILL, SIGTERM).
func ParseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 65 {
		return syscall.Signal(n), nil
	}
	if sig, ok := signals[strings.TrimPrefix(s, "SIG")]; ok {
		return sig, nil
	}
	return 0, fmt.Errorf("unknown signal %q", s)
}
