package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkCoordination measures what a global checkpoint costs beyond
// the dumps themselves, for 4, 8 and 16 ranks on 4 nodes: t_coord (the
// time ranks stay frozen minus the slowest rank's prepare, i.e. RPCs, the
// commit transaction in etcd and the thaw orders) and t_cont (that slowest
// prepare minus its runc+CRIU dump: network lock, freeze, file capture),
// next to the time ranks stay frozen in the same round. The ranks run a slow ring (a message
// every few ms, TCP connections established) so that the figures are the
// coordination's, not CPU contention's. The baseline, measured in the same
// run, is what no coordination can avoid: one trivial request to every
// node at once (rpcWave) plus the round's own commit transaction.
func BenchmarkCoordination(b *testing.B) {
	c := testutil.NewCluster(b, 4)
	sum := map[int]time.Duration{} // t_coord + t_cont, by ranks
	for _, ranks := range []int{4, 8, 16} {
		job := fmt.Sprintf("co%d", ranks)
		c.OK("run", "--job", job, "--ranks", strconv.Itoa(ranks), "--", c.Bin, "ringapp",
			"-messages", "1000000000", "-window", "1", "-payload", "64", "-compute", "500000", "-progress", "0")
		time.Sleep(2 * time.Second) // the ring connects
		var coord, cont, stall, dump, persist []time.Duration
		for i := 0; i < envInt("CAIRN_BENCH_ROUNDS", 7); i++ {
			var ck struct {
				Stall   time.Duration `json:"stall_ns"`
				Coord   time.Duration `json:"coord_ns"`
				Cont    time.Duration `json:"cont_ns"`
				MaxDump time.Duration `json:"max_dump_ns"`
				Persist time.Duration `json:"persist_ns"`
			}
			if err := json.Unmarshal([]byte(c.OK("checkpoint", job, "--json")), &ck); err != nil {
				b.Fatal(err)
			}
			coord, cont, stall, dump, persist = append(coord, ck.Coord), append(cont, ck.Cont), append(stall, ck.Stall), append(dump, ck.MaxDump), append(persist, ck.Persist)
		}
		wave := rpcWave(b, c)
		floor := wave + median(persist)
		b.Logf("%2d ranks on 4 nodes: t_coord %5.1f ms (commit txn %4.1f ms) + t_cont %5.1f ms = %5.1f ms | ranks frozen %6.1f ms, slowest prepare %6.1f ms (medians of %d rounds; target t_coord+t_cont <= 50 ms at 16 ranks) | baseline: one RPC to every node at once %4.1f ms + the commit txn = %4.1f ms, t_coord %.1fx that",
			ranks, ms(median(coord)), ms(median(persist)), ms(median(cont)), ms(median(coord)+median(cont)), ms(median(stall)), ms(median(dump)), len(coord),
			ms(wave), ms(floor), float64(median(coord))/float64(floor))
		sum[ranks] = median(coord) + median(cont)
		c.OK("rm", "-f", job)
	}
	record(b, atMost("t_coord + t_cont, 16 ranks on 4 nodes ÷ 4 ranks on 4 nodes", sum[16].Seconds()/sum[4].Seconds(), 1.3,
		fmt.Sprintf("%.1f ms / %.1f ms", ms(sum[16]), ms(sum[4]))))
}

// rpcWave is the median time of one trivial request (Health) sent to
// every node's agent at once from the host, as the coordinator sends its
// commit and thaw orders: the floor of t_coord, with the commit txn.
func rpcWave(b *testing.B, c *testutil.Cluster) time.Duration {
	b.Helper()
	creds, err := pki.LoadCredentials(filepath.Join(c.Data, "cluster", "client"))
	if err != nil {
		b.Fatal(err)
	}
	var clients []*rpc.AgentClient
	for _, n := range c.Nodes {
		cl := rpc.NewAgentClient(net.JoinHostPort(nodeAddr(b, c, n), "7420"), n, creds)
		defer cl.Close()
		clients = append(clients, cl)
	}
	ctx := context.Background()
	var waves []time.Duration
	for i := range 8 {
		start := time.Now()
		var g errgroup.Group
		for _, cl := range clients {
			g.Go(func() error { _, err := cl.Health(ctx); return err })
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		if i > 0 { // the first opens the connections, as a coordinator has
			waves = append(waves, time.Since(start))
		}
	}
	return median(waves)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkRingOverhead runs the same ring job three ways in one run: as
// plain processes on the host (the baseline), as a 4-rank cluster job on 4
// nodes without checkpoints (container and overlay-network overhead), and
// with a global checkpoint every CAIRN_BENCH_CKPT_EVERY (default 30s;
// checkpoint overhead). CAIRN_BENCH_RING_MESSAGES sizes the job (default
// 4,000,000 messages: a minute or more here); CAIRN_BENCH_RING_COMPUTE
// adds that many rounds of computation per message (default 0: the job
// only communicates, the worst case for network overhead).
func BenchmarkRingOverhead(b *testing.B) {
	messages := envInt("CAIRN_BENCH_RING_MESSAGES", 4_000_000)
	every := 30 * time.Second
	if d, err := time.ParseDuration(os.Getenv("CAIRN_BENCH_CKPT_EVERY")); err == nil {
		every = d
	}
	compute := envInt("CAIRN_BENCH_RING_COMPUTE", 0)
	bin := testutil.CairnBinary(b)
	args := []string{"ringapp", "-messages", strconv.Itoa(messages), "-progress", "0", "-compute", strconv.Itoa(compute)}

	// Plain processes on the host, over loopback.
	start := time.Now()
	var procs []*exec.Cmd
	for r := 0; r < 4; r++ {
		cmd := exec.Command(bin, append(args, "-rank", strconv.Itoa(r), "-size", "4",
			"-peers", "127.0.0.1,127.0.0.1,127.0.0.1,127.0.0.1", "-port-base", "17300")...)
		cmd.Env = append(os.Environ(), "CAIRN_JOB=bench")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		procs = append(procs, cmd)
	}
	for _, p := range procs {
		if err := p.Wait(); err != nil {
			b.Fatalf("ring on the host: %v", err)
		}
	}
	bare := time.Since(start)

	c := testutil.NewCluster(b, 4)
	runJob := func(name string, extra ...string) (time.Duration, int) {
		start := time.Now()
		c.OK(append(append([]string{"run", "--job", name, "--ranks", "4", "--per-node", "1"}, extra...), append([]string{"--", bin}, args...)...)...)
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		out, err := exec.CommandContext(ctx, c.Bin, "--data", c.Data, "--staging", c.Staging, "wait", name).CombinedOutput()
		if err != nil {
			b.Fatalf("wait %s: %v\n%s", name, err, out)
		}
		d := time.Since(start)
		n := 0
		for _, ck := range c.Ckpts(name) {
			if ck.State == "durable" || ck.State == "protected" {
				n++
			}
		}
		return d, n
	}
	plain, _ := runJob("plain")
	ckpt, n := runJob("ckpt", "--checkpoint-every", every.String())
	b.Logf("ring of 4 ranks, %d messages of 4 KiB each, compute %d: host processes %.1fs | cluster job %.1fs (container+network overhead %+.1f%%, target <= 2%%) | with a checkpoint every %s: %.1fs, %d checkpoints (checkpoint overhead %+.1f%%)",
		messages, compute, bare.Seconds(), plain.Seconds(), 100*(plain.Seconds()/bare.Seconds()-1), every, ckpt.Seconds(), n, 100*(ckpt.Seconds()/plain.Seconds()-1))
}
