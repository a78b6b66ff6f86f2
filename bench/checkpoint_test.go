package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/criu"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// rounds is how often each figure is measured; the median is reported.
const rounds = 3

// sizesMiB are the amounts of dirty memory measured; CAIRN_BENCH_SIZES
// overrides them (e.g. "64,256").
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

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
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

// warmMemory writes and frees mib MiB of tmpfs once. On a VM whose memory
// the hypervisor backs lazily, the first touch of a guest page is far
// slower than any later one; without this, whichever measurement first
// touches fresh memory pays for it.
func warmMemory(b *testing.B, mib int) {
	b.Helper()
	p := filepath.Join("/dev/shm", fmt.Sprintf("cairn-bench-warm-%d", os.Getpid()))
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(p)
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for range mib {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// dropCaches writes back and drops the page cache, so that each
// measurement starts with the same free memory: on a VM that backs guest
// memory lazily, a page cache grown by the previous measurement would make
// the next one touch fresh memory, which is far slower.
func dropCaches() {
	exec.Command("sync").Run()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0)
}

// bareProcess starts the program outside any container, as a session
// leader with stdio on files, and returns it once its memory is dirty.
func bareProcess(b *testing.B, app string, mib int) *exec.Cmd {
	b.Helper()
	work := b.TempDir()
	f, _ := os.Create(filepath.Join(work, "out"))
	defer f.Close()
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	// Nothing may grow its open files after a dump, or the bare restore
	// refuses them: count once an hour, print only "ready".
	cmd := exec.Command(app, "stateapp", "-no-stream", "-dir", work, "-mem", fmt.Sprint(mib), "-dirty-every", "1h", "-interval", "1h")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFile(b, filepath.Join(work, "out"), "ready")
	return cmd
}

// bareDump dumps pid with plain `criu dump --leave-running` into dir,
// fsyncing it if sync, and returns the time taken and the bytes written.
func bareDump(b *testing.B, criuBin string, pid int, dir string, sync bool) (time.Duration, int64) {
	b.Helper()
	os.RemoveAll(dir)
	os.MkdirAll(dir, 0o700)
	t := time.Now()
	dump := exec.Command(criuBin, "dump", "-t", fmt.Sprint(pid), "-D", dir, "-R", "-o", "dump.log")
	if o, err := dump.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
		b.Fatalf("bare criu dump: %v %s %s", err, o, criu.LastErrors(log, 3))
	}
	if sync {
		exec.Command("sync", "-f", dir).Run()
	}
	return time.Since(t), dirSize(dir)
}

// bareRestore restores a bare dump detached and returns the time until
// criu returns. It restores into a pid namespace of its own (with its own
// /proc), as cairn's containers have: the dumped process's pid is free
// there, where on the host the process a previous round restored may
// still hold it as a zombie nobody reaps ("Can't fork for PID: File
// exists"). The namespace, and the restored process with it, ends when
// criu, its first process, returns.
func bareRestore(b *testing.B, criuBin, dir string) time.Duration {
	b.Helper()
	t := time.Now()
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", criuBin, "restore", "-D", dir, "-d", "-o", "restore.log")
	if o, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "restore.log"))
		b.Fatalf("bare criu restore (the baseline of cairn's restore): %v %s %s", err, o, criu.LastErrors(log, 3))
	}
	return time.Since(t)
}

// BenchmarkCheckpoint measures, for a container whose process has dirtied
// N MiB: the application stall of `cairn checkpoint`, its total time and
// bytes written, next to a bare `criu dump` of the same program (outside a
// container) into tmpfs and into the data disk (fsynced); and `cairn
// restore` next to a bare `criu restore` from tmpfs. Medians of 3 rounds;
// every round stores the whole image, as the bare dump writes it (the
// previous round's image is removed and collected), and one more
// checkpoint, with every chunk stored already, shows what unchanged
// memory costs. The first restore takes that checkpoint's image kept in
// staging (once), the others read the store.
func BenchmarkCheckpoint(b *testing.B) {
	ctx := context.Background()
	app := testutil.CairnBinary(b)
	criuBin, err := criu.Find("")
	if err != nil {
		b.Fatal(err)
	}
	sizes := sizesMiB()
	warmMemory(b, 4*slices.Max(sizes)+512)
	fmt.Printf("\n%-6s %-30s %10s %10s %12s %9s\n", "MiB", "what (median of 3)", "stall", "total", "bytes", "ratio")
	row := func(mib int, what string, stall, total time.Duration, bytes int64, ratio float64) {
		f := func(d time.Duration) string {
			if d == 0 {
				return ""
			}
			return d.Round(time.Millisecond).String()
		}
		bs, rs := "", ""
		if bytes > 0 {
			bs = fmt.Sprint(bytes)
		}
		if ratio > 0 {
			rs = fmt.Sprintf("%.2fx", ratio)
		}
		fmt.Printf("%-6d %-30s %10s %10s %12s %9s\n", mib, what, f(stall), f(total), bs, rs)
	}
	for _, mib := range sizes {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			env := testutil.NewEnv(b, func(o *container.Options) { o.KeepImages = 4 << 30 })
			m := env.Manager
			in, err := m.Run(ctx, container.Config{Name: "bench", Args: []string{app, "stateapp", "-no-stream",
				"-dir", "/var/lib/stateapp", "-mem", fmt.Sprint(mib), "-dirty-every", "1h"}})
			if err != nil {
				b.Fatal(err)
			}
			waitFile(b, in.Log, "ready")
			bare := bareProcess(b, app, mib)
			time.Sleep(time.Second) // let both Go runtimes settle after the big allocation

			tmpfsDir := filepath.Join("/dev/shm", fmt.Sprintf("cairn-bench-%d", os.Getpid()))
			diskDir := filepath.Join(b.TempDir(), "bare")
			defer os.RemoveAll(tmpfsDir)
			var bareT, bareD, stall, total, dump []time.Duration
			var bareBytes, cairnBytes int64
			for r := range rounds {
				dropCaches()
				d, n := bareDump(b, criuBin, bare.Process.Pid, tmpfsDir, false)
				bareT, bareBytes = append(bareT, d), n
				dropCaches()
				d, _ = bareDump(b, criuBin, bare.Process.Pid, diskDir, true)
				bareD = append(bareD, d)
				dropCaches()
				man, err := m.Checkpoint(ctx, "bench", container.CheckpointOptions{})
				if err != nil {
					b.Fatal(err)
				}
				stall, total, dump = append(stall, man.Timing.Stall), append(total, man.Timing.Total), append(dump, man.Timing.Dump)
				cairnBytes = man.Size()
				if r < rounds-1 {
					// Every round stores the whole image, as the bare dump
					// writes it: the memory never changes, so without the
					// gc a later round would find every chunk stored.
					if err := m.Repo().Remove("bench", man.Seq); err != nil {
						b.Fatal(err)
					}
					if _, err := m.Repo().GC(ctx, image.GCOptions{Keep: 1}); err != nil {
						b.Fatal(err)
					}
				}
			}
			// One more, with every chunk stored already: what a checkpoint
			// of unchanged memory costs.
			dropCaches()
			again, err := m.Checkpoint(ctx, "bench", container.CheckpointOptions{})
			if err != nil {
				b.Fatal(err)
			}
			row(mib, "bare criu dump -> tmpfs", median(bareT), 0, bareBytes, 0)
			row(mib, "bare criu dump -> disk+fsync", 0, median(bareD), 0, 0)
			row(mib, "cairn checkpoint", median(stall), median(total), cairnBytes, float64(median(stall))/float64(median(bareT)))
			row(mib, "  of which CRIU via runc", median(dump), 0, 0, 0)
			row(mib, "  total vs bare disk+fsync", 0, median(total), 0, float64(median(total))/float64(median(bareD)))
			row(mib, "cairn checkpoint, nothing new", again.Timing.Stall, again.Timing.Total, 0, float64(again.Timing.Total)/float64(median(bareD)))
			b.ReportMetric(float64(median(stall))/float64(median(bareT)), "stall/bare-tmpfs")
			b.ReportMetric(float64(median(total))/float64(median(bareD)), "total/bare-disk")

			// Restore: cairn (verify + materialize + overlay + netns + CRIU)
			// next to a bare criu restore of the tmpfs dump.
			bare.Process.Kill()
			bare.Wait()
			// The newest checkpoint's image is kept in staging: the first
			// restore takes it from there, without the store.
			if err := m.Kill(ctx, "bench", syscall.SIGKILL); err != nil {
				b.Fatal(err)
			}
			dropCaches()
			t := time.Now()
			if _, err := m.Restore(ctx, "bench", container.RestoreOptions{}); err != nil {
				b.Fatal(err)
			}
			keptR := time.Since(t)
			var bareR, bareRD, cairnR []time.Duration
			for range rounds {
				bareR = append(bareR, bareRestore(b, criuBin, tmpfsDir))
				dropCaches()
				bareRD = append(bareRD, bareRestore(b, criuBin, diskDir))
				dropCaches()
				if err := m.Kill(ctx, "bench", syscall.SIGKILL); err != nil {
					b.Fatal(err)
				}
				t := time.Now()
				if _, err := m.Restore(ctx, "bench", container.RestoreOptions{}); err != nil {
					b.Fatal(err)
				}
				cairnR = append(cairnR, time.Since(t))
			}
			row(mib, "bare criu restore (tmpfs)", 0, median(bareR), 0, 0)
			row(mib, "bare criu restore (disk, cold)", 0, median(bareRD), 0, 0)
			row(mib, "cairn restore (verify+restore)", 0, median(cairnR), 0, float64(median(cairnR))/float64(median(bareR)))
			row(mib, "  vs bare restore from disk", 0, 0, 0, float64(median(cairnR))/float64(median(bareRD)))
			row(mib, "cairn restore (kept image)", 0, keptR, 0, float64(keptR)/float64(median(bareR)))
			b.ReportMetric(float64(median(cairnR))/float64(median(bareR)), "restore/bare")
			r := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
			figs := []figure{
				atMost(fmt.Sprintf("checkpoint stall ÷ bare full dump to tmpfs, %d MiB", mib), median(stall).Seconds()/median(bareT).Seconds(), 1.2,
					fmt.Sprintf("%s / %s", r(median(stall)), r(median(bareT)))),
				atMost(fmt.Sprintf("restore from the kept image ÷ bare criu restore from tmpfs, %d MiB", mib), keptR.Seconds()/median(bareR).Seconds(), 1.5,
					fmt.Sprintf("%s (one sample) / %s", r(keptR), r(median(bareR)))),
			}
			if mib >= 256 {
				figs = append(figs, atMost(fmt.Sprintf("checkpoint durable ÷ bare dump to disk + fsync, %d MiB", mib), median(total).Seconds()/median(bareD).Seconds(), 2.0,
					fmt.Sprintf("%s / %s", r(median(total)), r(median(bareD)))))
			}
			record(b, figs...)
		})
	}
}
