package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/internal/container"
	"cairn/internal/criu"
	"cairn/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// sizesMiB are the amounts of dirty memory measured; CAIRN_BENCH_SIZES
// overrides them (e.g. "64").
func sizesMiB() []int {
	if s := os.Getenv("CAIRN_BENCH_SIZES"); s != "" {
		var out []int
		for _, f := range strings.Split(s, ",") {
			var n int
			fmt.Sscan(f, &n)
			out = append(out, n)
		}
		return out
	}
	return []int{64, 256, 1024}
}

func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func waitFile(b *testing.B, p, substr string) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if data, _ := os.ReadFile(p); strings.Contains(string(data), substr) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatalf("timed out waiting for %q in %s", substr, p)
}

// bareDump starts the same program outside any container and dumps it with
// plain `criu dump --leave-running` into dir; it returns the dump time and
// the pid (still running).
func bareDump(b *testing.B, criuBin, app string, mib int, dir string) (time.Duration, int64) {
	b.Helper()
	work := b.TempDir()
	out := filepath.Join(work, "out")
	f, _ := os.Create(out)
	defer f.Close()
	cmd := exec.Command(app, "stateapp", "-no-stream", "-dir", work, "-mem", fmt.Sprint(mib), "-dirty-every", "1h")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	cmd.Stdin = devnull
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	waitFile(b, out, "ready")
	os.MkdirAll(dir, 0o700)
	t := time.Now()
	dump := exec.Command(criuBin, "dump", "-t", fmt.Sprint(cmd.Process.Pid), "-D", dir, "-R", "-o", filepath.Join(work, "dump.log"))
	if o, err := dump.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(work, "dump.log"))
		b.Fatalf("bare criu dump: %v %s %s", err, o, criu.LastErrors(log, 3))
	}
	d := time.Since(t)
	return d, dirSize(dir)
}

// bareRestore kills nothing: it restores a dump of a process that has
// already ended, detached, and returns the time until criu returns.
func bareRestore(b *testing.B, criuBin, dir string) time.Duration {
	b.Helper()
	t := time.Now()
	cmd := exec.Command(criuBin, "restore", "-D", dir, "-d", "-o", filepath.Join(dir, "restore.log"), "--pidfile", filepath.Join(dir, "pid"))
	if o, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "restore.log"))
		b.Fatalf("bare criu restore: %v %s %s", err, o, criu.LastErrors(log, 3))
	}
	d := time.Since(t)
	// The restored tree is a child of the criu that exited: find it by
	// the dump's root pid and end it.
	if pidB, err := os.ReadFile(filepath.Join(dir, "pid")); err == nil {
		var pid int
		fmt.Sscan(string(pidB), &pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return d
}

// BenchmarkCheckpoint measures, for a container whose process has dirtied
// N MiB: the application stall of `cairn checkpoint`, its total time and
// bytes written, next to a bare `criu dump` of the same program into tmpfs
// and into the data disk; and `cairn restore` next to a bare `criu
// restore`.
func BenchmarkCheckpoint(b *testing.B) {
	ctx := context.Background()
	app := testutil.CairnBinary(b)
	criuBin, err := criu.Find("")
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("\n%-6s %-28s %10s %10s %10s %9s\n", "MiB", "what", "stall", "total", "bytes", "ratio")
	for _, mib := range sizesMiB() {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			env := testutil.NewEnv(b)
			m := env.Manager
			in, err := m.Run(ctx, container.Config{Name: "bench", Args: []string{app, "stateapp", "-no-stream",
				"-dir", "/var/lib/stateapp", "-mem", fmt.Sprint(mib), "-dirty-every", "1h"}})
			if err != nil {
				b.Fatal(err)
			}
			waitFile(b, in.Log, "ready")

			// Baselines first, on a fresh process of the same kind.
			tmpfsDir := filepath.Join("/dev/shm", fmt.Sprintf("cairn-bench-%d", os.Getpid()))
			diskDir := filepath.Join(b.TempDir(), "bare")
			defer os.RemoveAll(tmpfsDir)
			bareTmpfs, bareBytes := bareDump(b, criuBin, app, mib, tmpfsDir)
			bareDisk, _ := bareDump(b, criuBin, app, mib, diskDir)
			// fsync the disk dump so the comparison includes persisting.
			syncStart := time.Now()
			exec.Command("sync", "-f", diskDir).Run()
			bareDisk += time.Since(syncStart)

			man, err := m.Checkpoint(ctx, "bench", container.CheckpointOptions{})
			if err != nil {
				b.Fatal(err)
			}
			st := man.Timing
			fmt.Printf("%-6d %-28s %10s %10s %10d %9s\n", mib, "bare criu dump -> tmpfs", bareTmpfs.Round(time.Millisecond), "", bareBytes, "")
			fmt.Printf("%-6d %-28s %10s %10s %10s %9s\n", mib, "bare criu dump -> disk+sync", bareDisk.Round(time.Millisecond), "", "", "")
			fmt.Printf("%-6d %-28s %10s %10s %10d %8.2fx\n", mib, "cairn checkpoint", st.Stall.Round(time.Millisecond), st.Total.Round(time.Millisecond), man.Size(),
				float64(st.Stall)/float64(bareTmpfs))
			fmt.Printf("%-6d %-28s %10s %10s %10s %8.2fx\n", mib, "  total vs bare disk+sync", "", st.Total.Round(time.Millisecond), "", float64(st.Total)/float64(bareDisk))
			fmt.Printf("%-6d %-28s %10s %10s %10s %9s\n", mib, "  of which runc checkpoint", st.Dump.Round(time.Millisecond), "", "", "")
			fmt.Printf("%-6d %-28s %10s %10s %10s %9s\n", mib, "  of which fs delta capture", st.Capture.Round(time.Millisecond), "", "", "")
			b.ReportMetric(float64(st.Stall)/float64(bareTmpfs), "stall/bare-tmpfs")
			b.ReportMetric(float64(st.Total)/float64(bareDisk), "total/bare-disk")

			// Restore: cairn (verify + materialize + overlay + netns + CRIU)
			// next to a bare criu restore of the tmpfs dump.
			if err := m.Kill(ctx, "bench", syscall.SIGKILL); err != nil {
				b.Fatal(err)
			}
			bareR := bareRestore(b, criuBin, tmpfsDir)
			t := time.Now()
			if _, err := m.Restore(ctx, "bench", container.RestoreOptions{}); err != nil {
				b.Fatal(err)
			}
			cr := time.Since(t)
			fmt.Printf("%-6d %-28s %10s %10s %10s %9s\n", mib, "bare criu restore (tmpfs)", "", bareR.Round(time.Millisecond), "", "")
			fmt.Printf("%-6d %-28s %10s %10s %10s %8.2fx\n", mib, "cairn restore", "", cr.Round(time.Millisecond), "", float64(cr)/float64(bareR))
			b.ReportMetric(float64(cr)/float64(bareR), "restore/bare")
		})
	}
}
