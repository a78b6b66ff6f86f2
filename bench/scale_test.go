package bench

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
)

// BenchmarkRoundScale measures how the coordinator's share of a global
// checkpoint grows with the job: a real coordinator on a real embedded
// etcd (on this machine's disk) drives jobs of 100, 1,000 and 10,000
// ranks, ten ranks a node, on in-memory agents (coord/memagent: every call
// is answered at once, so what is measured is the coordinator and its
// catalog, not CRIU). For each size, after a warm-up round, it takes
// CAIRN_BENCH_SCALE_ROUNDS rounds (default 3) and reports, per round:
// t_coord (ranks frozen minus the slowest prepare, the round's own
// overhead), the round from request to durable, and what the coordinator
// wrote to etcd until the checkpoint was protected (puts and bytes). The
// baseline is the 100-rank job of the same run: the ratios say how each
// figure grows, next to the growth of the job (100x at 10,000 ranks).
// CAIRN_BENCH_SCALE_MAX caps the ranks (default 10000).
func BenchmarkRoundScale(b *testing.B) {
	rounds := envInt("CAIRN_BENCH_SCALE_ROUNDS", 3)
	maxRanks := envInt("CAIRN_BENCH_SCALE_MAX", 10000)
	type result struct {
		ranks, nodes  int
		coord, round  time.Duration
		persist       time.Duration
		puts, bytes   int64
		start, joined time.Duration
	}
	var results []result
	for _, size := range []struct{ ranks, nodes int }{{100, 10}, {1000, 100}, {10000, 1000}} {
		if size.ranks > maxRanks {
			continue
		}
		r := result{ranks: size.ranks, nodes: size.nodes}
		func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			e, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: b.TempDir(), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			cat, err := catalog.Open(ctx, catalog.Config{Endpoints: e.Endpoints()})
			if err != nil {
				b.Fatal(err)
			}
			defer cat.Close()
			mc := memagent.New(memagent.Options{Hold: 5 * time.Minute})
			for i := range size.nodes {
				mc.AddNode(fmt.Sprintf("n%04d", i))
			}
			// A long lease: 1,000 nodes' heartbeats are real load on the
			// coordinator and etcd, kept to one a node every 15 s.
			co := coord.New(cat, nil, nil, coord.Options{
				Deadline: 2 * time.Minute, NodeTTL: time.Minute,
				Dial: func(n coordv1.Node, term agentv1.Term) coord.Agent { return mc.Client("c", n.Name).WithTerm(term) },
			})
			wait := co.Start(ctx)
			defer wait()
			defer cancel()
			t0 := time.Now()
			if err := mc.Join(ctx, co, 15*time.Second); err != nil {
				b.Fatal(err)
			}
			r.joined = time.Since(t0)
			t0 = time.Now()
			if _, err := co.RunJob(ctx, coordv1.RunJob{Name: "big", Ranks: size.ranks, Args: []string{"/bin/app"}}); err != nil {
				b.Fatal(err)
			}
			r.start = time.Since(t0)
			for i := range rounds + 1 {
				before := cat.Written()
				t0 := time.Now()
				ck, err := co.Checkpoint(ctx, "big", coordv1.CheckpointJob{})
				if err != nil {
					b.Fatalf("round %d of %d ranks: %v", i, size.ranks, err)
				}
				took := time.Since(t0)
				// The round's writes end when the checkpoint is protected
				// (its replication, none here, is accounted).
				for {
					cks, err := co.Checkpoints(ctx, "big")
					if err == nil && cks[len(cks)-1].State == coordv1.CkptProtected {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				w := cat.Written()
				if i == 0 {
					continue // warm-up
				}
				r.coord += ck.Coord
				r.persist += ck.Persist
				r.round += took
				r.puts += w.Puts - before.Puts
				r.bytes += w.Bytes - before.Bytes
			}
		}()
		n := time.Duration(rounds)
		r.coord, r.round, r.persist = r.coord/n, r.round/n, r.persist/n
		r.puts, r.bytes = r.puts/int64(rounds), r.bytes/int64(rounds)
		results = append(results, r)
		runtime.GC()
	}
	base := results[0]
	b.Logf("%8s %6s %10s %8s %10s %10s %8s %8s %12s %8s %10s %10s", "ranks", "nodes", "t_coord", "x", "decision", "round", "x", "puts", "etcd bytes", "x", "bytes/rank", "job start")
	for _, r := range results {
		b.Logf("%8d %6d %10s %8.1f %10s %10s %8.1f %8d %12d %8.1f %10d %10s", r.ranks, r.nodes,
			r.coord.Round(time.Microsecond), float64(r.coord)/float64(base.coord), r.persist.Round(time.Microsecond),
			r.round.Round(time.Microsecond), float64(r.round)/float64(base.round),
			r.puts, r.bytes, float64(r.bytes)/float64(base.bytes), r.bytes/int64(r.ranks), r.start.Round(time.Millisecond))
		b.ReportMetric(r.coord.Seconds(), fmt.Sprintf("t_coord_s/%d-ranks", r.ranks))
		b.ReportMetric(float64(r.bytes), fmt.Sprintf("etcd_bytes/%d-ranks", r.ranks))
	}
}
