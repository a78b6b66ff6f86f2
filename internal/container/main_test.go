package container_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

const countFile = "var/lib/stateapp/count.log"

var (
	recvRE  = regexp.MustCompile(`(?m)^recv=(\d+)`)
	countRE = regexp.MustCompile(`^count=(\d+) t=(\d+)$`)
)

// runStateApp starts the stateful test program in a container.
func runStateApp(t *testing.T, env *testutil.Env, name string, extra ...string) *container.Info {
	t.Helper()
	bin := testutil.CairnBinary(t)
	args := append([]string{bin, "stateapp", "-dir", "/var/lib/stateapp"}, extra...)
	in, err := env.Manager.Run(context.Background(), container.Config{Name: name, Args: args})
	if err != nil {
		t.Fatalf("run %s: %v", name, err)
	}
	return in
}

// lastRecv returns the last recv=N in b.
func lastRecv(b []byte) int {
	ms := recvRE.FindAllSubmatch(b, -1)
	if len(ms) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(string(ms[len(ms)-1][1]))
	return n
}

// waitLog waits until cond holds for the container's log from offset on.
func waitLog(t *testing.T, logPath string, offset int, what string, cond func([]byte) bool) []byte {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		if len(b) >= offset && cond(b[offset:]) {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; log from offset %d:\n%s", what, offset, tail(b[min(offset, len(b)):], 2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// waitStreaming waits until the receiver has seen at least n more messages
// than at offset, and returns the log.
func waitStreaming(t *testing.T, logPath string, offset, n int) []byte {
	t.Helper()
	return waitLog(t, logPath, offset, "the TCP stream", func(b []byte) bool {
		if bytes.Contains(b, []byte("FAIL")) {
			t.Fatalf("the program failed:\n%s", tail(b, 2000))
		}
		return lastRecv(b) >= n
	})
}

// countLines parses count.log content into its lines, checking the format.
func countLines(t *testing.T, b []byte) []string {
	t.Helper()
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if !countRE.MatchString(sc.Text()) {
			t.Fatalf("bad count.log line %q", sc.Text())
		}
		lines = append(lines, sc.Text())
	}
	return lines
}

// checkContiguous checks that lines count 1, 2, 3, ... without gaps.
func checkContiguous(t *testing.T, lines []string) {
	t.Helper()
	for i, l := range lines {
		n, _ := strconv.Atoi(countRE.FindStringSubmatch(l)[1])
		if n != i+1 {
			t.Fatalf("count.log line %d is %q: counter not contiguous", i+1, l)
		}
	}
}

func readCount(t *testing.T, in *container.Info) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(in.RootFS, countFile))
	if err != nil {
		t.Fatal(err)
	}
	return countLines(t, b)
}

func ckptCount(t *testing.T, env *testutil.Env, name string, seq int) []string {
	t.Helper()
	b, err := env.Manager.Repo().ReadDeltaFile(context.Background(), name, seq, countFile)
	if err != nil {
		t.Fatal(err)
	}
	return countLines(t, b)
}
