package migrate

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/testutil"
)

// clockRank reads CLOCK_MONOTONIC and CLOCK_BOOTTIME every 50 ms, as an
// MPI progress engine's timeouts do, and prints them every second. It
// ends (exit 3) if either runs back, or (exit 4) if either leaps ahead
// by more than a minute between two readings.
const clockRank = `
import sys, time
prev = None
n = 0
while True:
    now = (time.clock_gettime(time.CLOCK_MONOTONIC), time.clock_gettime(time.CLOCK_BOOTTIME))
    if prev:
        for name, a, b in zip(("monotonic", "boottime"), prev, now):
            if b < a:
                print(f"{name} went back {a - b:.3f} s", flush=True); sys.exit(3)
            if b - a > 60:
                print(f"{name} leapt {b - a:.3f} s", flush=True); sys.exit(4)
    if n % 20 == 0:
        print(f"clocks {now[0]:.3f} {now[1]:.3f}", flush=True)
    prev = now
    n += 1
    time.sleep(0.05)
`

var clocksRE = regexp.MustCompile(`(?m)^clocks ([0-9.]+) ([0-9.]+)$`)

// clockReadings is the last monotonic and boot-time reading a clock
// rank's log shows, and how many it shows (none while the rank starts).
func clockReadings(log string) (mono, boot float64, n int) {
	all := clocksRE.FindAllStringSubmatch(log, -1)
	if len(all) == 0 {
		return 0, 0, 0
	}
	last := all[len(all)-1]
	mono, _ = strconv.ParseFloat(last[1], 64)
	boot, _ = strconv.ParseFloat(last[2], 64)
	return mono, boot, len(all)
}

// lastClocks is clockReadings of a log that must show one.
func lastClocks(t *testing.T, log string) (mono, boot float64, n int) {
	t.Helper()
	mono, boot, n = clockReadings(log)
	if n == 0 {
		t.Fatalf("no clock readings in the rank's log:\n%s", log)
	}
	return mono, boot, n
}

// hostMonotonic is this host's CLOCK_MONOTONIC in seconds.
func hostMonotonic(t *testing.T) float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

// TestClocksAcrossUptimes: node n2's clocks run 11.6 days ahead of n1's,
// as on a machine booted that much earlier (`up --clock-offset`). A rank
// started on n2 migrates to n1 and back: each time its monotonic and
// boot-time clocks go on from where they were (CRIU's restore puts it in
// a time namespace with the offsets the new host needs), where with the
// new host's clocks they would run back, or leap ahead, by the hosts'
// difference.
func TestClocksAcrossUptimes(t *testing.T) {
	const offset = 1_000_000 // seconds
	c := testutil.NewCluster(t, 2, "--clock-offset", fmt.Sprintf("n2=%ds", offset))
	older, younger := c.Nodes[1], c.Nodes[0]
	c.OK("run", "--job", "clk", "--ranks", "1", "--nodes", older, "--", "/usr/bin/python3", "-u", "-c", clockRank)

	// waitReadings waits for readings past the n-th and returns the last.
	waitReadings := func(after int) (mono, boot float64, n int) {
		t.Helper()
		testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
			log := c.Logs("clk", 0)
			if strings.Contains(log, "went back") || strings.Contains(log, "leapt") {
				t.Fatalf("the rank's clocks jumped:\n%s", log)
			}
			mono, boot, n = clockReadings(log)
			return n > after+1, fmt.Sprintf("%d clock readings, want more than %d:\n%s", n, after+1, log)
		})
		return mono, boot, n
	}
	mono, _, n := waitReadings(0)
	if host := hostMonotonic(t); mono < host+offset-60 {
		t.Fatalf("the rank on %s reads monotonic %.0f s, host %.0f s: the node's clocks are not %d s ahead", older, mono, host, offset)
	}
	for _, to := range []string{younger, older} {
		before, beforeBoot, _ := lastClocks(t, c.Logs("clk", 0))
		start := time.Now()
		m := c.Migrate("clk/0", "--to", to)
		if m.State != "done" || m.To != to {
			t.Fatalf("migration to %s: %+v", to, m)
		}
		mono, boot, n2 := waitReadings(n)
		n = n2
		elapsed := time.Since(start).Seconds()
		// The readings since: no step back, and no more ahead than the
		// time that passed (the clocks stop while the rank is an image).
		if mono < before || mono > before+elapsed+2 || boot < beforeBoot || boot > beforeBoot+elapsed+2 {
			t.Fatalf("after moving to %s in %.1f s the rank reads monotonic %.3f, boot time %.3f; before it, %.3f and %.3f", to, elapsed, mono, boot, before, beforeBoot)
		}
		// What made it so: the restored rank's time namespace is ahead
		// of this host's by about the older node's lead, less the time
		// the rank has spent as an image since it started.
		pid := c.Status("clk").RankStates[0].Pid
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/timens_offsets", pid))
		if err != nil {
			t.Fatal(err)
		}
		var sec, nsec int64
		if _, err := fmt.Sscanf(string(b), "monotonic %d %d", &sec, &nsec); err != nil {
			t.Fatalf("timens_offsets of the rank (pid %d): %v: %q", pid, err, b)
		}
		if sec > offset || sec < offset-60 {
			t.Errorf("the rank restored on %s has a monotonic offset of %d s; the node it started on is %d s ahead", to, sec, offset)
		}
	}
	if st := c.Status("clk"); st.State != "running" || st.RankStates[0].Status != "running" {
		t.Fatalf("job after two moves: %+v", st)
	}
}
