package container_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestExecTTY: a command exec'd on a terminal gets one of its own, of the
// size of the terminal it is given (runc copies it, which may take it a
// moment: the command waits for a size), its stdout and
// stderr both on it, and input typed on that terminal; its exit code is
// returned.
func TestExecTTY(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	if _, err := m.Run(ctx, container.Config{Name: "tty", Args: []string{"sleep", "1000"}}); err != nil {
		t.Fatal(err)
	}
	master, slave := testutil.Terminal(t, 33, 101)
	if _, err := master.Write([]byte("typed\r")); err != nil {
		t.Fatal(err)
	}
	out := make(chan string)
	go func() {
		b, _ := io.ReadAll(master) // EIO once no one holds the slave
		out <- string(b)
	}()
	code, err := m.ExecTTY(ctx, "tty", []string{"sh", "-c", `tty; while [ "$(stty size)" = "0 0" ]; do sleep 0.05; done; stty size; echo to-stderr >&2; read l; echo got $l; exit 4`}, slave, slave, nil)
	slave.Close()
	got := <-out
	if err != nil || code != 4 {
		t.Fatalf("exec on a terminal: exit %d, %v; printed %q", code, err, got)
	}
	for _, want := range []string{"/dev/pts/", "33 101\r\n", "to-stderr\r\n", "got typed\r\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("exec on a terminal printed %q, without %q", got, want)
		}
	}
}
