package launch

import (
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// dialTimeout bounds how long an agent retries reaching a daemon that is
// not listening yet.
var dialTimeout = 30 * time.Second

// Rsh is the agent a launcher runs as `cairn rsh HOST CMD...`: it runs CMD
// in HOST's launch daemon as ssh would (the words joined by spaces, given
// to /bin/sh -c: launchers quote for a remote shell), relays stdin,
// stdout, stderr and SIGINT, SIGTERM and SIGHUP, and returns the command's
// exit status. It returns 255 if it cannot reach or start the command; in
// an MPICH job it then also ends its parent (hydra's mpiexec waits forever
// for a proxy that never connects back).
func Rsh(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) < 2 {
		fmt.Fprintln(stderr, "usage: cairn rsh HOST COMMAND...")
		return 255
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "cairn rsh: "+format+"\n", a...)
		if os.Getenv(EnvMPI) == MPICH {
			_ = syscall.Kill(os.Getppid(), syscall.SIGTERM)
		}
		return 255
	}
	secret, err := hex.DecodeString(os.Getenv(EnvSecret))
	if err != nil || len(secret) < 16 {
		return fail("no job secret in $%s: cairn rsh runs only inside a rank of an MPI job", EnvSecret)
	}
	port := Port
	if p, err := strconv.Atoi(os.Getenv(EnvPort)); err == nil && p > 0 {
		port = p
	}
	host := args[0]
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	var c *conn
	for start := time.Now(); ; {
		if c, err = dial(addr, secret, 2*time.Second); err == nil {
			break
		}
		if time.Since(start) > dialTimeout {
			return fail("%s: %v", host, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer c.c.Close()
	if err := c.send(frameCommand, []byte(strings.Join(args[1:], " "))); err != nil {
		return fail("%s: %v", host, err)
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := stdin.Read(buf)
			if n > 0 {
				if c.send(frameStdin, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				_ = c.send(frameStdinEOF, nil)
				return
			}
		}
	}()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go func() {
		for s := range sigs {
			_ = c.send(frameSignal, []byte{byte(s.(syscall.Signal))})
		}
	}()
	for {
		t, p, err := c.recv()
		if err != nil {
			return fail("%s: the connection ended before the command did (%v); a wrong secret ends it at once", host, err)
		}
		switch t {
		case frameStdout:
			_, _ = stdout.Write(p)
		case frameStderr:
			_, _ = stderr.Write(p)
		case frameExit:
			return codeOf(p)
		}
	}
}
