package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/testutil"

	"golang.org/x/sys/unix"
)

// mpiFinalRE is the last line of examples/mpi/mpiring.c's rank 0.
var mpiFinalRE = regexp.MustCompile(`FINAL size=(\d+) iters=(\d+) .* checksum=([0-9a-f]{16}) loop=([0-9.]+)s`)

// mpiBenchRanks is the size of every MPI job here: one rank on each of the
// cluster's 4 nodes.
const mpiBenchRanks = 4

// BenchmarkMPI measures what cairn costs an unmodified MPI job, in one run
// on one 4-node local cluster, with examples/mpi/mpiring.c (a ring
// exchange of 256 KiB and an allreduce per iteration over 4 MiB of state
// per rank, plus the computation that mixes that state):
//
//  1. Runtime. The job under cairn (`cairn run --job --mpi KIND`, 4 ranks
//     on 4 nodes, talking over the job's VXLAN network) next to the same
//     program launched by plain mpirun (Open MPI) or mpiexec.hydra (MPICH)
//     without containers, one process in each of 4 network namespaces:
//     "underlay", the namespaces of the 4 nodes, talking over the nodes'
//     underlay addresses; and "jobnet", the namespaces of the 4 ranks of an
//     idle cairn job (`sleep`), talking over that job's VXLAN network as
//     the ranks of a cairn job do, which separates what the containers cost
//     from what the overlay network costs. The launcher runs in the first
//     namespace, its hosts are the addresses, and its remote-shell agent is
//     a script that runs the command in the namespace that holds the
//     address. The baselines use the settings cairn applies (docs/mpi.md:
//     btl self,tcp, pml ob1, bind-to none, the interfaces restricted to
//     the network the processes talk over; hydra's -iface); for MPICH,
//     whose UCX would otherwise use shared memory between processes of one
//     machine whatever their network namespace, UCX_TLS=self,tcp, so that
//     the processes talk over TCP as they do between containers.
//     CAIRN_BENCH_MPI_RUNS runs (default 9), each of the three variants
//     back to back in an order that rotates from run to run. The total is
//     from the launch until the launcher exits (for cairn: from `cairn
//     run` until rank 0's init, which ends with the launcher, exits), cut
//     into launch (until the first MPI process starts), MPI_Init (until
//     the last one returned from it; both from the realtime stamps the
//     program prints), the program's own loop (to 0.1 s) and the rest
//     (final gather, MPI_Finalize, exits). Reported: medians, and the
//     medians over runs of the ratios and differences of the variants
//     within a run. Every run's checksum must be the same.
//
//  2. Checkpoint stall. The MPI job with CAIRN_BENCH_MPI_MIB (default 64)
//     MiB of state per rank (mpiring --mib, every page rewritten each
//     iteration) next to the ring job (`cairn ringapp`, a TCP ring between
//     the ranks) whose ranks hold the same amount of random memory
//     (`cairn stateapp -mem`, started beside ringapp in each rank: ringapp
//     has no memory of its own to speak of). Both with --replicas 0. In
//     each of CAIRN_BENCH_MPI_ROUNDS blocks (default 4), alternating which
//     job goes first, one job at a time runs and is checkpointed 3 times;
//     the stall is the time its ranks stay frozen (the coordinator's
//     figure). It also reports each rank's staged image size and, per
//     rank, what processes it holds with their anonymous and shared memory
//     (what CRIU writes of them), threads, sockets and mappings, and the
//     files it wrote (captured with it), taken before the first checkpoint.
//
// CAIRN_BENCH_MPI (default "openmpi,mpich") selects the implementations,
// CAIRN_BENCH_MPI_PARTS (default "runtime,stall") the parts;
// CAIRN_BENCH_MPI_ITERS (default 250) sizes the runtime job.
func BenchmarkMPI(b *testing.B) {
	kinds := strings.Split(envStr("CAIRN_BENCH_MPI", "openmpi,mpich"), ",")
	iters := envInt("CAIRN_BENCH_MPI_ITERS", 250)
	runs := envInt("CAIRN_BENCH_MPI_RUNS", 9)
	mib := envInt("CAIRN_BENCH_MPI_MIB", 64)
	blocks := envInt("CAIRN_BENCH_MPI_ROUNDS", 4)

	progs := buildMPIRing(b, kinds)
	c := testutil.NewCluster(b, mpiBenchRanks)

	parts := envStr("CAIRN_BENCH_MPI_PARTS", "runtime,stall")
	var summary, details []string
	if strings.Contains(parts, "runtime") {
		s, d := mpiRuntime(b, c, kinds, progs, iters, runs)
		summary, details = append(summary, s...), append(details, d...)
		summary = append(summary, "load average after the runtime part: "+loadAvg())
	}
	if strings.Contains(parts, "stall") {
		s, d := mpiStall(b, c, kinds, progs, mib, blocks)
		summary, details = append(summary, s...), append(details, d...)
		summary = append(summary, "load average at the end: "+loadAvg())
	}
	b.Log("\n" + strings.Join(summary, "\n") + "\n" + strings.Join(details, "\n"))
}

// mpiRuntime is part 1 of BenchmarkMPI: the runtime of mpiring, three
// ways: "underlay" (mpirun across the nodes' namespaces, over their
// underlay addresses), "jobnet" (mpirun across the namespaces of an idle
// cairn job's ranks, over that job's VXLAN network, but outside its
// containers) and "cairn" (the job).
func mpiRuntime(b *testing.B, c *testutil.Cluster, kinds []string, progs map[string]string, iters, runs int) (summary, details []string) {
	b.Helper()
	var nodeNetns, nodeAddrs []string
	for _, n := range c.Nodes {
		nodeNetns, nodeAddrs = append(nodeNetns, netw.NetnsPath(n)), append(nodeAddrs, nodeAddr(b, c, n))
	}
	underlay := newMPIBaseline(b, nodeNetns, nodeAddrs, "eth0")
	c.OK("run", "--job", "jobnet", "--ranks", strconv.Itoa(mpiBenchRanks), "--per-node", "1", "--replicas", "0", "--", "/bin/sleep", "infinity")
	jobnet := newMPIBaseline(b, c.RankNetns("jobnet"), jobAddrs(b, c, "jobnet"), "eth0")
	args := []string{"--iters", strconv.Itoa(iters), "--every", "0", "--sleep-ms", "0"}
	variants := []string{"underlay", "jobnet", "cairn"}
	what := map[string]string{
		"underlay": "mpirun across the node namespaces (underlay)",
		"jobnet":   "mpirun across the rank namespaces (job VXLAN)",
		"cairn":    "cairn job",
	}
	figs := map[string]map[string][]mpiRun{} // kind → variant → per run
	sums := map[string]bool{}
	for i := range runs {
		for _, kind := range kinds {
			if figs[kind] == nil {
				figs[kind] = map[string][]mpiRun{}
			}
			// Each run rotates the order of the variants.
			for k := range variants {
				v := variants[(i+k)%len(variants)]
				start := time.Now()
				var d time.Duration
				var out string
				switch v {
				case "underlay":
					d, out = underlay.run(b, kind, progs[kind], args)
				case "jobnet":
					d, out = jobnet.run(b, kind, progs[kind], args)
				case "cairn":
					d, out = runMPIJob(b, c, fmt.Sprintf("rt-%s-%d", kind, i), kind, progs[kind], args)
				}
				f, sum := mpiFigures(b, v+" "+kind, out, iters, start, d)
				figs[kind][v] = append(figs[kind][v], f)
				sums[sum] = true
				details = append(details, fmt.Sprintf("run %2d %-7s %-46s %s, checksum %s", i+1, kind, what[v]+":", f, sum))
			}
			if len(sums) != 1 {
				b.Fatalf("the runs disagree on the checksum: %v\n%s", slices.Collect(maps.Keys(sums)), strings.Join(details, "\n"))
			}
		}
	}
	c.OK("rm", "-f", "jobnet")
	for _, kind := range kinds {
		f := figs[kind]
		// ratio is the median over runs of variant x's figure ÷ variant
		// y's in the same run: the variants of a run ran back to back, so
		// their ratio is less exposed to this shared machine's drift than
		// a ratio of medians.
		ratio := func(x, y string, fig func(mpiRun) time.Duration) float64 {
			var rs []float64
			for i := range f[x] {
				rs = append(rs, fig(f[x][i]).Seconds()/fig(f[y][i]).Seconds())
			}
			return medianF(rs)
		}
		// diff is the median over runs of the difference.
		diff := func(x, y string, fig func(mpiRun) time.Duration) time.Duration {
			var ds []time.Duration
			for i := range f[x] {
				ds = append(ds, fig(f[x][i])-fig(f[y][i]))
			}
			return medianD(ds).Round(time.Millisecond)
		}
		med := func(v string) mpiRun {
			var m mpiRun
			for _, x := range []struct {
				dst *time.Duration
				fig func(mpiRun) time.Duration
			}{{&m.total, mpiTotal}, {&m.launch, mpiLaunch}, {&m.init, mpiInit}, {&m.loop, mpiLoop}, {&m.rest, mpiRest}} {
				var ds []time.Duration
				for _, r := range f[v] {
					ds = append(ds, x.fig(r))
				}
				*x.dst = medianD(ds)
			}
			return m
		}
		summary = append(summary, fmt.Sprintf("%-7s runtime, %d ranks on %d nodes, %d iterations, medians of %d runs:", kind, mpiBenchRanks, mpiBenchRanks, iters, runs))
		for _, v := range variants {
			summary = append(summary, fmt.Sprintf("          %-46s %s", what[v]+":", med(v)))
		}
		summary = append(summary, fmt.Sprintf("          median of per-run ratios, total (loop): cairn/underlay %.3f (%.3f) [target <= 1.02] | cairn/jobnet %.3f (%.3f) | jobnet/underlay %.3f (%.3f)",
			ratio("cairn", "underlay", mpiTotal), ratio("cairn", "underlay", mpiLoop), ratio("cairn", "jobnet", mpiTotal), ratio("cairn", "jobnet", mpiLoop),
			ratio("jobnet", "underlay", mpiTotal), ratio("jobnet", "underlay", mpiLoop)))
		summary = append(summary, fmt.Sprintf("          cairn - underlay, medians of per-run differences: total %s = launch %s + MPI_Init %s + loop %s + rest %s",
			diff("cairn", "underlay", mpiTotal), diff("cairn", "underlay", mpiLaunch), diff("cairn", "underlay", mpiInit), diff("cairn", "underlay", mpiLoop), diff("cairn", "underlay", mpiRest)))
		// The start: until every rank has returned from MPI_Init.
		started := func(r mpiRun) time.Duration { return mpiLaunch(r) + mpiInit(r) }
		cm, um := med("cairn"), med("underlay")
		record(b,
			atMost(fmt.Sprintf("MPI job start ÷ bare mpirun start, %s, %d ranks", kind, mpiBenchRanks), ratio("cairn", "underlay", started), 1.5,
				fmt.Sprintf("%s / %s", started(cm).Round(time.Millisecond), started(um).Round(time.Millisecond))),
			atMost(fmt.Sprintf("MPI run time ÷ bare mpirun, %s, %d ranks", kind, mpiBenchRanks), ratio("cairn", "underlay", mpiTotal), 1.02,
				fmt.Sprintf("%s / %s", mpiTotal(cm).Round(time.Millisecond), mpiTotal(um).Round(time.Millisecond))))
	}
	return summary, details
}

// mpiStall is part 2 of BenchmarkMPI: the checkpoint stall of an MPI job
// next to that of the ring job with the same memory per rank.
func mpiStall(b *testing.B, c *testutil.Cluster, kinds []string, progs map[string]string, mib, blocks int) (summary, details []string) {
	b.Helper()
	warmMemory(b, 2*mpiBenchRanks*mib+512)
	mpiArgs := []string{"--mib", strconv.Itoa(mib), "--iters", "100000000", "--every", "1", "--sleep-ms", "500"}
	stateDir := "/var/lib/stateapp"
	ringCmd := []string{"/bin/sh", "-c", fmt.Sprintf("%s stateapp -no-stream -mem %d -dirty-every 0 -interval 1h -dir %s & exec %s ringapp -messages 1000000000 -window 1 -payload 64 -compute 500000 -progress 0",
		c.Bin, mib, stateDir, c.Bin)}
	for _, kind := range kinds {
		var mpiCk, ringCk []coordv1.Ckpt
		var mpiCensus, ringCensus []string
		for blk := range blocks {
			mpiBlock := func() {
				job := fmt.Sprintf("st-%s-%d", kind, blk)
				startMPIJob(b, c, job, kind, progs[kind], mpiArgs)
				testutil.WaitUntil(b, 2*time.Minute, func() (bool, string) {
					out := c.Logs(job, 0)
					return strings.Contains(out, "progress 2/"), "the MPI job never got going:\n" + out
				})
				if mpiCensus == nil {
					mpiCensus = rankCensus(b, c, job)
				}
				mpiCk = append(mpiCk, checkpointRounds(b, c, job, 3)...)
				c.OK("rm", "-f", job)
			}
			ringBlock := func() {
				job := fmt.Sprintf("st-ring-%s-%d", kind, blk)
				c.OK(append([]string{"run", "--job", job, "--ranks", strconv.Itoa(mpiBenchRanks), "--per-node", "1", "--replicas", "0", "--"}, ringCmd...)...)
				testutil.WaitUntil(b, 2*time.Minute, func() (bool, string) {
					for r := range mpiBenchRanks {
						out := c.Logs(job, r)
						if !strings.Contains(out, fmt.Sprintf("mem=%dMiB ready", mib)) || !strings.Contains(out, "ring connected") {
							return false, fmt.Sprintf("rank %d of the ring job not ready:\n%s", r, out)
						}
					}
					return true, ""
				})
				time.Sleep(time.Second)
				if ringCensus == nil {
					ringCensus = rankCensus(b, c, job)
				}
				ringCk = append(ringCk, checkpointRounds(b, c, job, 3)...)
				c.OK("rm", "-f", job)
			}
			if blk%2 == 0 {
				mpiBlock()
				ringBlock()
			} else {
				ringBlock()
				mpiBlock()
			}
		}
		mst, rst := ckptStalls(mpiCk), ckptStalls(ringCk)
		summary = append(summary, fmt.Sprintf("%-7s checkpoint stall, %d MiB per rank, medians of %d: MPI job %s, ring job %s, ratio %.2f | staged image per rank: MPI %s, ring %s | slowest CRIU dump: MPI %s, ring %s",
			kind, mib, len(mst), medianD(mst).Round(time.Millisecond), medianD(rst).Round(time.Millisecond), medianD(mst).Seconds()/medianD(rst).Seconds(),
			rankSizes(mpiCk), rankSizes(ringCk), medianD(maxDumps(mpiCk)).Round(time.Millisecond), medianD(maxDumps(ringCk)).Round(time.Millisecond)))
		details = append(details, fmt.Sprintf("%s stalls: MPI %v, ring %v", kind, roundAll(mst), roundAll(rst)))
		details = append(details, "MPI job's ranks ("+kind+"):")
		details = append(details, mpiCensus...)
		details = append(details, "ring job's ranks:")
		details = append(details, ringCensus...)
	}
	return summary, details
}

// loadAvg is the machine's load average (1, 5, 15 minutes): how busy
// whatever else shares it was.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func envStr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// buildMPIRing compiles examples/mpi/mpiring.c with each implementation's
// compiler into a directory of the benchmark's own.
func buildMPIRing(b *testing.B, kinds []string) map[string]string {
	b.Helper()
	dir, err := os.MkdirTemp("", "cairn-bench-mpi-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	cc := map[string]string{"openmpi": "/usr/bin/mpicc.openmpi", "mpich": "/usr/bin/mpicc.mpich"}
	out := map[string]string{}
	for _, k := range kinds {
		if cc[k] == "" {
			b.Fatalf("CAIRN_BENCH_MPI: unknown MPI %q", k)
		}
		bin := filepath.Join(dir, "mpiring."+k)
		if o, err := exec.Command(cc[k], "-O2", "-o", bin, "../examples/mpi/mpiring.c").CombinedOutput(); err != nil {
			b.Fatalf("%s (make setup installs Open MPI and MPICH): %v\n%s", cc[k], err, o)
		}
		out[k] = bin
	}
	return out
}

// mpiRun is where the time of one run of mpiring went.
type mpiRun struct {
	total  time.Duration // launch until the launcher (for cairn: rank 0) exited
	launch time.Duration // until the first MPI process started
	init   time.Duration // then until the last one returned from MPI_Init
	loop   time.Duration // the program's loop (to 0.1 s)
	rest   time.Duration // the remainder: the final gather, MPI_Finalize, exits
}

func mpiTotal(r mpiRun) time.Duration  { return r.total }
func mpiLaunch(r mpiRun) time.Duration { return r.launch }
func mpiInit(r mpiRun) time.Duration   { return r.init }
func mpiLoop(r mpiRun) time.Duration   { return r.loop }
func mpiRest(r mpiRun) time.Duration   { return r.rest }

func (r mpiRun) String() string {
	f := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	return fmt.Sprintf("total %s = launch %s + MPI_Init %s + loop %s + rest %s", f(r.total), f(r.launch), f(r.init), f(r.loop), f(r.rest))
}

// mpiInitRE is a rank's first line: when its process started and when it
// returned from MPI_Init, in the realtime clock's seconds (every rank,
// container or not, reads the host's clock).
var mpiInitRE = regexp.MustCompile(`rank \d+/\d+ on \S+ pid \d+ MPI_Init [0-9.]+s \(wall (\d+)\.(\d{3}) -> (\d+)\.(\d{3})\)`)

// mpiFigures parses rank 0's output of a run that started at start and
// took total: where the time went, and the checksum.
func mpiFigures(b *testing.B, what, out string, iters int, start time.Time, total time.Duration) (mpiRun, string) {
	b.Helper()
	m := mpiFinalRE.FindStringSubmatch(out)
	inits := mpiInitRE.FindAllStringSubmatch(out, -1)
	if m == nil || m[1] != strconv.Itoa(mpiBenchRanks) || m[2] != strconv.Itoa(iters) || len(inits) != mpiBenchRanks {
		b.Fatalf("%s: no first lines of %d ranks or no final line of %d iterations:\n%s", what, mpiBenchRanks, iters, out)
	}
	at := func(sec, milli string) time.Time {
		s, _ := strconv.ParseInt(sec, 10, 64)
		ms, _ := strconv.ParseInt(milli, 10, 64)
		return time.Unix(s, ms*int64(time.Millisecond))
	}
	var first, ready time.Time
	for _, l := range inits {
		if t := at(l[1], l[2]); first.IsZero() || t.Before(first) {
			first = t
		}
		if t := at(l[3], l[4]); t.After(ready) {
			ready = t
		}
	}
	secs, _ := strconv.ParseFloat(m[4], 64)
	r := mpiRun{total: total, launch: first.Sub(start), init: ready.Sub(first), loop: time.Duration(secs * float64(time.Second))}
	r.rest = total - r.launch - r.init - r.loop
	return r, m[3]
}

// startMPIJob starts PROGRAM ARGS as an MPI job of one rank per node.
func startMPIJob(b *testing.B, c *testutil.Cluster, job, kind, prog string, args []string) {
	b.Helper()
	c.OK(append([]string{"run", "--job", job, "--ranks", strconv.Itoa(mpiBenchRanks), "--per-node", "1", "--replicas", "0", "--mpi", kind, "--", prog}, args...)...)
}

// runMPIJob runs an MPI job to its end and returns the time from `cairn
// run` until rank 0's init (the launch daemon, which exits when the
// launcher has) exited, and rank 0's output; the job is removed. (`cairn
// wait` polls every 0.5 s: timing it would add a quarter of a second on
// average that is not the job's.)
func runMPIJob(b *testing.B, c *testutil.Cluster, job, kind, prog string, args []string) (time.Duration, string) {
	b.Helper()
	start := time.Now()
	startMPIJob(b, c, job, kind, prog, args)
	pid := c.Status(job).RankStates[0].Pid
	if pid <= 0 {
		b.Fatalf("no pid for rank 0 of %s", job)
	}
	waitExit(b, pid)
	d := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.Bin, "--data", c.Data, "--staging", c.Staging, "wait", job).CombinedOutput()
	if err != nil {
		b.Fatalf("wait %s: %v\n%s\nrank 0:\n%s", job, err, out, c.Logs(job, 0))
	}
	logs := c.Logs(job, 0)
	c.OK("rm", "-f", job)
	return d, logs
}

// mpiBaseline launches MPI programs with plain mpirun or mpiexec across
// network namespaces, one process in each, without containers.
type mpiBaseline struct {
	netns  []string // paths of the namespaces, in rank order
	addrs  []string // an address in each, in the same order
	subnet netip.Prefix
	iface  string // the interface of addrs in every namespace
	rsh    string // the remote-shell agent
	token  string // in the environment of every process the baseline starts
}

// newMPIBaseline prepares launches across netns, whose addrs are on
// interface iface.
func newMPIBaseline(b *testing.B, netns, addrs []string, iface string) *mpiBaseline {
	b.Helper()
	bl := &mpiBaseline{netns: netns, addrs: addrs, iface: iface}
	out, err := exec.Command("nsenter", "--net="+netns[0], "--", "ip", "-j", "addr", "show", "dev", iface).Output()
	if err != nil {
		b.Fatalf("ip addr in %s: %v", netns[0], err)
	}
	var links []struct {
		Addrs []struct {
			Family string `json:"family"`
			Local  string `json:"local"`
			Len    int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		b.Fatal(err)
	}
	for _, l := range links {
		for _, a := range l.Addrs {
			if a.Family == "inet" && a.Local == addrs[0] {
				bl.subnet = netip.MustParsePrefix(fmt.Sprintf("%s/%d", a.Local, a.Len)).Masked()
			}
		}
	}
	if !bl.subnet.IsValid() {
		b.Fatalf("no address %s on %s in %s: %s", addrs[0], iface, netns[0], out)
	}
	// The agent: `rsh HOST COMMAND...` runs COMMAND with sh in the
	// network namespace that holds HOST, as ssh would on that machine,
	// and under a host name of its own (the namespace's name), as on
	// another machine or in a rank's container: Open MPI's daemons name
	// their session directories in /tmp after the host, and daemons that
	// share one race there (orted crashes in hwloc_shmem_topology_write).
	// Launchers quote their commands for a remote shell.
	var script strings.Builder
	script.WriteString("#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n")
	for i, a := range addrs {
		fmt.Fprintf(&script, "%s) ns=%s ;;\n", a, netns[i])
	}
	script.WriteString("*) echo \"rsh: unknown host $host\" >&2; exit 255 ;;\nesac\n" +
		"exec nsenter --net=\"$ns\" -- unshare --uts -- /bin/sh -c 'hostname \"${0##*/}\" && exec /bin/sh -c \"$1\"' \"$ns\" \"$*\"\n")
	f, err := os.CreateTemp(b.TempDir(), "rsh-")
	if err == nil {
		_, err = f.WriteString(script.String())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o755)
	}
	if err != nil {
		b.Fatal(err)
	}
	bl.rsh = f.Name()
	tok := make([]byte, 8)
	rand.Read(tok)
	bl.token = "CAIRN_BENCH_MPI_BASELINE=" + hex.EncodeToString(tok)
	b.Cleanup(bl.killLeftovers)
	return bl
}

// jobAddrs returns the addresses of a job's ranks, in rank order.
func jobAddrs(b *testing.B, c *testutil.Cluster, job string) []string {
	b.Helper()
	var jobs []struct {
		Name  string   `json:"name"`
		Addrs []string `json:"addrs"`
	}
	if err := jsonUnmarshal(c.OK("jobs", "--json"), &jobs); err != nil {
		b.Fatal(err)
	}
	for _, j := range jobs {
		if j.Name == job {
			return j.Addrs
		}
	}
	b.Fatalf("no job %s", job)
	return nil
}

// run runs prog with args as a job of one process per node and returns
// its wall time and output.
func (bl *mpiBaseline) run(b *testing.B, kind, prog string, args []string) (time.Duration, string) {
	b.Helper()
	hosts := make([]string, len(bl.addrs))
	for i, a := range bl.addrs {
		hosts[i] = a + ":1"
	}
	n := strconv.Itoa(len(hosts))
	argv := []string{"nsenter", "--net=" + bl.netns[0], "--"}
	switch kind {
	case "openmpi":
		argv = append(argv, "/usr/bin/mpirun.openmpi", "--allow-run-as-root", "-np", n, "-H", strings.Join(hosts, ","),
			"--bind-to", "none", "--mca", "plm_rsh_agent", bl.rsh,
			"--mca", "oob_tcp_if_include", bl.subnet.String(), "--mca", "btl_tcp_if_include", bl.subnet.String(),
			"--mca", "btl", "self,tcp", "--mca", "pml", "ob1")
	case "mpich":
		argv = append(argv, "/usr/bin/mpiexec.hydra", "-launcher", "rsh", "-launcher-exec", bl.rsh,
			"-hosts", strings.Join(hosts, ","), "-n", n, "-iface", bl.iface, "-genv", "UCX_TLS", "self,tcp")
		// The same finalize fix cairn preloads (docs/mpi.md): without it
		// most runs of Debian 12's MPICH hang in MPI_Finalize.
		if fix := "/opt/cairn/lib/libcairn-mpich-finalize.so"; fileExists(fix) {
			argv = append(argv, "-genv", "LD_PRELOAD", fix)
		}
	}
	argv = append(append(argv, prog), args...)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), bl.token)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	bl.killLeftovers()
	if err != nil {
		b.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out.String())
	}
	return d, out.String()
}

// waitExit blocks until process pid (not a child) has exited. It sleeps
// in poll(2) on a pidfd rather than polling /proc: a waiter that woke up
// every few milliseconds would change how the scheduler treats the MPI
// processes, which spin while they wait for messages (measured: a loop
// that sleeps 2 ms at a time beside 4 spinning ranks on 2 cores made them
// 5-20% faster).
func waitExit(b *testing.B, pid int) {
	b.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err == unix.ESRCH {
		return
	}
	if err != nil {
		b.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			b.Fatalf("poll pidfd of %d: %v", pid, err)
		}
		if n > 0 {
			return
		}
	}
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// killLeftovers kills, by PID, every process the baseline started that
// still runs (the launcher's daemons and the MPI processes inherit its
// environment, and with it the baseline's token).
func (bl *mpiBaseline) killLeftovers() {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && slices.Contains(strings.Split(string(env), "\x00"), bl.token) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// checkpointRounds takes n global checkpoints of a job, 2 s apart, after
// writing back and dropping the page cache, and returns them.
func checkpointRounds(b *testing.B, c *testutil.Cluster, job string, n int) []coordv1.Ckpt {
	b.Helper()
	var out []coordv1.Ckpt
	for range n {
		dropCaches()
		var ck coordv1.Ckpt
		if err := json.Unmarshal([]byte(c.OK("checkpoint", job, "--json")), &ck); err != nil {
			b.Fatal(err)
		}
		out = append(out, ck)
		time.Sleep(2 * time.Second)
	}
	return out
}

func ckptStalls(cks []coordv1.Ckpt) []time.Duration {
	var out []time.Duration
	for _, ck := range cks {
		out = append(out, ck.Stall)
	}
	return out
}

func maxDumps(cks []coordv1.Ckpt) []time.Duration {
	var out []time.Duration
	for _, ck := range cks {
		out = append(out, ck.MaxDump)
	}
	return out
}

// rankSizes is the median staged image size of every rank, in MiB.
func rankSizes(cks []coordv1.Ckpt) string {
	if len(cks) == 0 {
		return ""
	}
	var parts []string
	for r := range cks[0].Ranks {
		var xs []float64
		for _, ck := range cks {
			if r < len(ck.Ranks) {
				xs = append(xs, float64(ck.Ranks[r].Size)/(1<<20))
			}
		}
		parts = append(parts, fmt.Sprintf("%.1f", medianF(xs)))
	}
	return strings.Join(parts, "/") + " MiB"
}

// rankCensus describes every rank of a job: its processes (from its
// init down), each with its anonymous and shared memory, threads (T),
// sockets (S) and memory mappings (V), and what the rank holds in /dev/shm
// and wrote to its files.
func rankCensus(b *testing.B, c *testutil.Cluster, job string) []string {
	b.Helper()
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(st)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 {
			ppid, _ := strconv.Atoi(f[1])
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []string
	for _, rs := range c.Status(job).RankStates {
		var procs []string
		var anon int64
		queue := []int{rs.Pid}
		for len(queue) > 0 {
			pid := queue[0]
			queue = append(queue[1:], children[pid]...)
			name, kib, threads := procInfo(pid)
			socks := 0
			fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			for _, fd := range fds {
				if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); strings.HasPrefix(l, "socket:") {
					socks++
				}
			}
			maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
			anon += kib
			procs = append(procs, fmt.Sprintf("%s %.1f MiB %dT %dS %dV", name, float64(kib)/1024, threads, socks, bytes.Count(maps, []byte("\n"))))
		}
		shm := dirSize(fmt.Sprintf("/proc/%d/root/dev/shm", rs.Pid))
		var upper int64
		var big []string // files written of 1 MiB or more
		if d := upperDir(rs.Pid); d != "" {
			filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
				if err == nil && fi.Mode().IsRegular() {
					upper += fi.Size()
					if fi.Size() >= 1<<20 {
						rel, _ := filepath.Rel(d, p)
						big = append(big, fmt.Sprintf("/%s %.1f MiB", rel, float64(fi.Size())/(1<<20)))
					}
				}
				return nil
			})
		}
		out = append(out, fmt.Sprintf("  rank %d: %d processes, %.1f MiB anonymous+shmem; /dev/shm %.1f MiB, files written %.1f MiB %v: %s",
			rs.Rank, len(procs), float64(anon)/1024, float64(shm)/(1<<20), float64(upper)/(1<<20), big, strings.Join(procs, ", ")))
	}
	return out
}

// upperDir is the overlay upper dir of a process's root: what its
// container wrote ("" if it has none).
func upperDir(pid int) string {
	mi, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		if len(f) < 10 || f[4] != "/" {
			continue
		}
		for _, o := range strings.Split(f[len(f)-1], ",") {
			if d, ok := strings.CutPrefix(o, "upperdir="); ok {
				return d
			}
		}
	}
	return ""
}

// procInfo returns a process's name (for the cairn binary, with its
// subcommand), RssAnon+RssShmem in KiB (what CRIU dumps of its memory)
// and number of threads.
func procInfo(pid int) (string, int64, int) {
	var kib int64
	threads := 0
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(st), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "RssAnon:", "RssShmem:":
			n, _ := strconv.ParseInt(f[1], 10, 64)
			kib += n
		case "Threads:":
			threads, _ = strconv.Atoi(f[1])
		}
	}
	cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	argv := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
	name := filepath.Base(argv[0])
	if name == "cairn" && len(argv) > 1 {
		name += " " + argv[1]
	}
	return name, kib, threads
}
