package testutil

import (
	"os"
	"testing"

	"github.com/cairn-hpc/cairn/internal/pty"
)

// Terminal opens a pseudo-terminal of rows x cols standing for a user's:
// its master (closed when the test ends) and the slave a program is given.
func Terminal(t testing.TB, rows, cols uint16) (master, slave *os.File) {
	t.Helper()
	master, slave, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Close(); slave.Close() })
	if err := pty.SetSize(master, rows, cols); err != nil {
		t.Fatal(err)
	}
	return master, slave
}
