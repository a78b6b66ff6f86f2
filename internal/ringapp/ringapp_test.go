package ringapp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/ringapp"
)

// childEnv makes the test binary run ringapp.Main with its arguments, so
// tests can start ranks as separate processes.
const childEnv = "CAIRN_RINGAPP_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(ringapp.Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func TestExpected(t *testing.T) {
	// Golden values: a change here changes what every recorded run expects.
	golden := []struct {
		size, messages, window int
		seed                   uint64
		want                   string
	}{
		{1, 1, 1, 0, "e76e542d18bcf58e"},
		{4, 1000, 64, 1, "0cb1513dfb26f57e"},
		{3, 100, 200, 7, "2421df7330155c02"},
	}
	for _, g := range golden {
		if got := ringapp.Expected(g.size, g.messages, g.window, g.seed); got != g.want {
			t.Errorf("Expected(%d, %d, %d, %d) = %s, want %s", g.size, g.messages, g.window, g.seed, got, g.want)
		}
	}

	base := ringapp.Expected(4, 1000, 64, 1)
	if again := ringapp.Expected(4, 1000, 64, 1); again != base {
		t.Fatalf("Expected is not deterministic: %s, then %s", base, again)
	}
	seen := map[string]string{base: "base"}
	for name, got := range map[string]string{
		"size 3":                    ringapp.Expected(3, 1000, 64, 1),
		"size 5":                    ringapp.Expected(5, 1000, 64, 1),
		"messages 999":              ringapp.Expected(4, 999, 64, 1),
		"messages 1001":             ringapp.Expected(4, 1001, 64, 1),
		"window 63":                 ringapp.Expected(4, 1000, 63, 1),
		"window 1":                  ringapp.Expected(4, 1000, 1, 1),
		"seed 2":                    ringapp.Expected(4, 1000, 64, 2),
		"window > messages":         ringapp.Expected(4, 10, 20, 1),
		"window > messages, larger": ringapp.Expected(4, 10, 30, 1),
	} {
		if prev, ok := seen[got]; ok {
			t.Errorf("%s and %s have the same result %s", name, prev, got)
		}
		seen[got] = name
	}
}

// runRing runs size ranks as goroutines on 127.0.0.1 and returns rank 0's
// result and the time the run took.
func runRing(t *testing.T, size, messages, window, payload int, seed uint64) (string, time.Duration) {
	t.Helper()
	lns := make([]net.Listener, size)
	addrs := make([]string, size)
	for r := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[r], addrs[r] = ln, ln.Addr().String()
	}
	out := filepath.Join(t.TempDir(), "result")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, size)
	results := make([]string, size)
	logs := make([]strings.Builder, size)
	start := time.Now()
	for r := range size {
		wg.Go(func() {
			results[r], errs[r] = ringapp.Run(ctx, ringapp.Config{
				Job: "test", Rank: r, Size: size, Addrs: addrs, Listener: lns[r],
				Messages: messages, Window: window, Payload: payload, Seed: seed, Compute: 10,
				Out: map[bool]string{true: out}[r == 0], ConnectTimeout: 10 * time.Second,
				Progress: 100 * time.Millisecond, Stdout: &logs[r],
			})
			if errs[r] != nil {
				cancel() // the other ranks would wait for ever
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	for r := range size {
		t.Logf("rank %d output:\n%s", r, logs[r].String())
	}
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != results[0]+"\n" {
		t.Errorf("result file %q, Run returned %q", b, results[0])
	}
	return results[0], took
}

func TestRing(t *testing.T) {
	tests := []struct {
		size, messages, window, payload int
	}{
		{1, 500, 8, 4096},
		{2, 2000, 64, 4096},
		{4, 2000, 64, 4096},
		{4, 3000, 1, 100},
		{3, 50, 100, 0},      // window larger than the run
		{3, 48, 48, 1 << 20}, // a window larger than all socket buffers
	}
	for _, tc := range tests {
		name := fmt.Sprintf("size=%d,messages=%d,window=%d,payload=%d", tc.size, tc.messages, tc.window, tc.payload)
		t.Run(name, func(t *testing.T) {
			got, _ := runRing(t, tc.size, tc.messages, tc.window, tc.payload, 42)
			if want := ringapp.Expected(tc.size, tc.messages, tc.window, 42); got != want {
				t.Errorf("result %s, want %s", got, want)
			}
		})
	}
}

// rankProc is one rank run as a child process.
type rankProc struct {
	cmd   *exec.Cmd
	lines chan string // stdout, line by line; closed at EOF
	out   strings.Builder
	mu    sync.Mutex
	done  chan error
}

// startRanks starts size ranks as processes with CAIRN_* set as cairn
// would, extra flags added, on size consecutive free ports of 127.0.0.1.
func startRanks(t *testing.T, size int, extra ...string) []*rankProc {
	t.Helper()
	base := freePorts(t, size)
	procs := make([]*rankProc, size)
	for r := range size {
		args := append([]string{"-port-base", fmt.Sprint(base), "-progress", "100ms"}, extra...)
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), childEnv+"=1", "CAIRN_JOB=ringtest",
			fmt.Sprintf("CAIRN_RANK=%d", r), fmt.Sprintf("CAIRN_SIZE=%d", size))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &rankProc{cmd: cmd, lines: make(chan string, 1024), done: make(chan error, 1)}
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				p.mu.Lock()
				p.out.WriteString(sc.Text() + "\n")
				p.mu.Unlock()
				select {
				case p.lines <- sc.Text():
				default:
				}
			}
			close(p.lines)
			p.done <- cmd.Wait()
		}()
		procs[r] = p
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-p.done
		})
	}
	return procs
}

// wait waits for the process to end and returns its exit code.
func (p *rankProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(timeout):
		t.Fatalf("rank still running after %v; output:\n%s", timeout, p.output())
		return -1
	}
}

func (p *rankProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// waitFor waits for a line of output containing s.
func (p *rankProc) waitFor(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("output ended without %q:\n%s", s, p.output())
			}
			if strings.Contains(l, s) {
				return
			}
		case <-deadline:
			t.Fatalf("no %q after %v:\n%s", s, timeout, p.output())
		}
	}
}

// freePorts returns the first of n consecutive ports of 127.0.0.1 that are
// free right now.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for range 100 {
		base := 20000 + rand.IntN(30000)
		var lns []net.Listener
		for i := range n {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if len(lns) == n {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// runProcs runs size ranks as processes until they end and returns the
// result rank 0 wrote and how long the run took.
func runProcs(t *testing.T, size, messages, window, payload int) (string, time.Duration) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "result")
	start := time.Now()
	procs := startRanks(t, size, "-messages", fmt.Sprint(messages), "-window", fmt.Sprint(window),
		"-payload", fmt.Sprint(payload), "-seed", "9", "-out", out)
	for r, p := range procs {
		if code := p.wait(t, 5*time.Minute); code != 0 {
			t.Errorf("rank %d: exit code %d; output:\n%s", r, code, p.output())
		}
	}
	took := time.Since(start)
	if t.Failed() {
		t.FailNow()
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(procs[0].output(), "result="+strings.TrimSpace(string(b))+"\n") {
		t.Errorf("rank 0 did not print the result it wrote (%q):\n%s", b, procs[0].output())
	}
	return strings.TrimSpace(string(b)), took
}

func TestProcesses(t *testing.T) {
	for _, size := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			const messages, window = 5000, 32
			got, _ := runProcs(t, size, messages, window, 4096)
			if want := ringapp.Expected(size, messages, window, 9); got != want {
				t.Errorf("result %s, want %s", got, want)
			}
		})
	}
}

// TestSIGTERM stops one rank in the middle of a run: it and its neighbours
// must exit non-zero, not hang.
func TestSIGTERM(t *testing.T) {
	procs := startRanks(t, 3, "-messages", "100000000")
	for _, p := range procs {
		p.waitFor(t, "msgs", time.Minute) // running, past the connect phase
	}
	if err := procs[1].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := procs[1].wait(t, 30*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("rank 1: exit code %d, want %d; output:\n%s", code, 128+int(syscall.SIGTERM), procs[1].output())
	}
	if out := procs[1].output(); !strings.Contains(out, "FAIL rank 1: stopped by SIGTERM") {
		t.Errorf("rank 1 does not say why it stopped:\n%s", out)
	}
	for _, r := range []int{0, 2} {
		if code := procs[r].wait(t, 30*time.Second); code == 0 {
			t.Errorf("rank %d: exit code 0 after rank 1 stopped; output:\n%s", r, procs[r].output())
		} else {
			t.Logf("rank %d: exit code %d: %s", r, code, lastLine(procs[r].output()))
		}
	}
}

// TestStopped stops every rank in the middle of a run (SIGSTOP, as a
// freezer would) for longer than the progress interval and resumes them:
// the run must complete with the expected result.
func TestStopped(t *testing.T) {
	// Long enough to print progress lines (every 100 ms) and be stopped
	// between them: a run that has ended cannot be stopped.
	const size, messages, window = 3, 200000, 64
	out := filepath.Join(t.TempDir(), "result")
	procs := startRanks(t, size, "-messages", fmt.Sprint(messages), "-window", fmt.Sprint(window), "-seed", "9", "-out", out)
	// A progress line ("K/M msgs"), not the last one ("done M msgs").
	procs[2].waitFor(t, fmt.Sprintf("/%d msgs", messages), time.Minute)
	for r, p := range procs {
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatalf("rank %d could not be stopped in the middle of the run: %v; output:\n%s", r, err, p.output())
		}
	}
	time.Sleep(2 * time.Second)
	for _, p := range procs {
		if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	for r, p := range procs {
		if code := p.wait(t, 2*time.Minute); code != 0 {
			t.Errorf("rank %d: exit code %d; output:\n%s", r, code, p.output())
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(b)), ringapp.Expected(size, messages, window, 9); got != want {
		t.Errorf("result %s, want %s", got, want)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestThroughput logs the rates of 4 ranks (processes) on this host, to size
// -messages for end-to-end tests. Under the race detector they are far lower
// than those of cairn ringapp.
func TestThroughput(t *testing.T) {
	const size, window, payload = 4, ringapp.DefaultWindow, ringapp.DefaultPayload
	messages := 200000
	if raceEnabled || testing.Short() {
		messages = 20000
	}
	got, took := runProcs(t, size, messages, window, payload)
	if want := ringapp.Expected(size, messages, window, 9); got != want {
		t.Errorf("result %s, want %s", got, want)
	}
	rate := float64(messages) / took.Seconds()
	note := ""
	if raceEnabled {
		note = " (race detector on)"
	}
	t.Logf("%d ranks, %d messages of %d bytes, window %d: %v, %.0f msgs/s, %.1f MB/s per link, %.1f MB/s in all%s",
		size, messages, payload, window, took.Round(time.Millisecond), rate,
		rate*float64(payload)/1e6, rate*float64(payload)*size/1e6, note)
	t.Logf("-messages for a 15 s run at this rate: %d", int(rate*15))
}

// TestHold: with -hold, rank 0 stops after that many messages and the
// ring waits, for longer than a run takes, until rank 0 gets SIGUSR1;
// the run then ends with the result of one never held. SIGUSR1 to
// another rank changes nothing.
func TestHold(t *testing.T) {
	const size, messages, window, hold = 3, 20000, 64, 10000
	out := filepath.Join(t.TempDir(), "result")
	procs := startRanks(t, size, "-messages", fmt.Sprint(messages), "-window", fmt.Sprint(window), "-seed", "9", "-out", out, "-hold", fmt.Sprint(hold))
	procs[0].waitFor(t, fmt.Sprintf("rank 0: holding after %d msgs", hold), time.Minute)
	if err := procs[1].cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	for r, p := range procs {
		if strings.Contains(p.output(), "done") {
			t.Fatalf("rank %d ended while rank 0 held:\n%s", r, p.output())
		}
	}
	if err := procs[0].cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	for r, p := range procs {
		if code := p.wait(t, 2*time.Minute); code != 0 {
			t.Errorf("rank %d: exit code %d; output:\n%s", r, code, p.output())
		}
	}
	if !strings.Contains(procs[0].output(), "rank 0: released") {
		t.Errorf("rank 0 does not say it was released:\n%s", procs[0].output())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(b)), ringapp.Expected(size, messages, window, 9); got != want {
		t.Errorf("result %s, want %s", got, want)
	}
}
