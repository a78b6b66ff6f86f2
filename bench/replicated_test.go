package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// BenchmarkRoundReplicated measures what a catalog replicated on three
// etcd members (`cairn up --coordinators 3`) costs a global checkpoint,
// next to one member, in the same run: a real coordinator, fenced by an
// election as a leading one is, drives a job on in-memory agents
// (coord/memagent, as in BenchmarkRoundScale) through a client of
//
//   - one embedded member (a cluster of its own), the baseline;
//   - a cluster of three embedded members in this process, peers over
//     mutual TLS on loopback, the coordinator connected to one member's
//     unix socket as a coordinator is to its own member: once a member
//     that follows etcd's raft leader (its writes go on to the leader), and
//     once the leader's.
//
// Jobs of 16 ranks on 4 nodes and of 10,000 ranks on 1,000 nodes
// (CAIRN_BENCH_SCALE_MAX caps the second, at a tenth as many nodes). For
// each, a warm-up round, then CAIRN_BENCH_SCALE_ROUNDS rounds (default 3):
// medians of t_coord, of the decision (the commit point's etcd
// transaction) and of the round from request to durable. t_coord is the
// time ranks stay frozen: in-memory agents dump in no time, so all of it
// is coordination (the record's Coord subtracts the 1 ms dump memagent
// reports but does not spend, which leaves nothing at 16 ranks). The
// target: t_coord of three members within 1.5x one member's.
func BenchmarkRoundReplicated(b *testing.B) {
	rounds := envInt("CAIRN_BENCH_SCALE_ROUNDS", 3)
	maxRanks := envInt("CAIRN_BENCH_SCALE_MAX", 10000)
	type size struct{ ranks, nodes int }
	sizes := []size{{16, 4}}
	if big := min(10000, maxRanks); big > 16 {
		sizes = append(sizes, size{big, max(big/10, 1)})
	}
	type setup struct {
		what     string
		members  int
		toLeader bool // connected to the member that leads etcd's raft
	}
	setups := []setup{{"1 member", 1, true}, {"3 members, via a follower", 3, false}, {"3 members, via the raft leader", 3, true}}
	type result struct {
		coord, decision, round, cpu time.Duration
	}
	results := map[size][]result{}
	for _, sz := range sizes {
		for _, st := range setups {
			var r result
			func() {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				ep, all, stop := replicatedEtcd(ctx, b, st.members, st.toLeader)
				defer stop()
				coords, decisions, rounds, cpus := replicatedRounds(ctx, b, ep, all, sz.ranks, sz.nodes, rounds)
				r = result{median(coords), median(decisions), median(rounds), median(cpus)}
				if st.members > 1 {
					// etcd's raft leadership must not have moved meanwhile:
					// the setup would not be the one measured.
					if lead, err := isRaftLeader(ctx, ep); err != nil || lead != st.toLeader {
						b.Fatalf("%s at %d ranks: the coordinator's member leads etcd's raft: %v (%v), want %v", st.what, sz.ranks, lead, err, st.toLeader)
					}
				}
			}()
			results[sz] = append(results[sz], r)
			runtime.GC()
		}
	}
	b.Logf("%8s %6s %-32s %10s %6s %10s %10s %6s %10s", "ranks", "nodes", "etcd", "t_coord", "x", "decision", "round", "x", "cpu")
	for _, sz := range sizes {
		base := results[sz][0]
		for i, r := range results[sz] {
			b.Logf("%8d %6d %-32s %10s %6.2f %10s %10s %6.2f %10s", sz.ranks, sz.nodes, setups[i].what,
				r.coord.Round(time.Microsecond), float64(r.coord)/float64(base.coord), r.decision.Round(time.Microsecond),
				r.round.Round(time.Microsecond), float64(r.round)/float64(base.round), r.cpu.Round(time.Millisecond))
		}
		for i, r := range results[sz][1:] {
			ratio := float64(r.coord) / float64(base.coord)
			verdict := "met"
			if ratio > 1.5 {
				verdict = "NOT met"
			}
			b.Logf("%d ranks, %s: t_coord 3 members / 1 member = %.2f; target <= 1.5: %s", sz.ranks, setups[i+1].what, ratio, verdict)
			b.ReportMetric(ratio, fmt.Sprintf("t_coord_3/1_%s/%d-ranks", map[bool]string{true: "leader", false: "follower"}[setups[i+1].toLeader], sz.ranks))
		}
		b.ReportMetric(ms(base.coord), fmt.Sprintf("t_coord_ms_1member/%d-ranks", sz.ranks))
	}
	alone, three := fsyncTime(b, 1), fsyncTime(b, 3)
	b.Logf("the disk under them: a 4 KiB write and fdatasync takes %s alone, %s with three at once (medians); three members share this machine's %d cores and this disk, each fsyncing every write",
		alone.Round(time.Microsecond), three.Round(time.Microsecond), runtime.NumCPU())
	b.ReportMetric(float64(alone)/float64(time.Microsecond), "fsync-us")
	b.ReportMetric(float64(three)/float64(time.Microsecond), "fsync-3-at-once-us")
}

// fsyncTime is the median time of a 4 KiB write and fdatasync at the end
// of a preallocated file, as etcd's WAL does for each write, with
// parallel writers doing the same at once, each to a file of its own in
// the same file system as the members' data.
func fsyncTime(b *testing.B, parallel int) time.Duration {
	b.Helper()
	const n = 50
	times := make([][]time.Duration, parallel)
	errs := make([]error, parallel)
	dir := b.TempDir()
	var wg sync.WaitGroup
	for p := range parallel {
		wg.Go(func() {
			f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("wal%d", p)), os.O_CREATE|os.O_WRONLY, 0o600)
			if err != nil {
				errs[p] = err
				return
			}
			defer f.Close()
			buf := make([]byte, 4096)
			if errs[p] = syscall.Fallocate(int(f.Fd()), 0, 0, n*int64(len(buf))); errs[p] != nil {
				return
			}
			for i := range n {
				t0 := time.Now()
				if _, errs[p] = f.WriteAt(buf, int64(i*len(buf))); errs[p] != nil {
					return
				}
				if errs[p] = syscall.Fdatasync(int(f.Fd())); errs[p] != nil {
					return
				}
				times[p] = append(times[p], time.Since(t0))
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	var all []time.Duration
	for _, ts := range times {
		all = append(all, ts...)
	}
	return median(all)
}

// replicatedEtcd starts an embedded etcd of members members (1 or 3) in
// this process and returns the client endpoints of the member a
// coordinator would use: with several, the one that leads etcd's raft if
// toLeader, a follower otherwise. stop closes every member.
func replicatedEtcd(ctx context.Context, b *testing.B, members int, toLeader bool) (endpoints, all []string, stop func()) {
	b.Helper()
	quiet := slog.New(slog.DiscardHandler)
	if members == 1 {
		e, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: b.TempDir(), Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		return e.Endpoints(), e.Endpoints(), func() { e.Close() }
	}
	ca, err := pki.Init(filepath.Join(b.TempDir(), "pki"), pki.InitOptions{})
	if err != nil {
		b.Fatal(err)
	}
	cred, err := ca.Issue(rpc.CoordServerName, pki.Coordinator, pki.IssueOptions{IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(b.TempDir(), "creds")
	if err := cred.Write(dir); err != nil {
		b.Fatal(err)
	}
	files := catalog.TLSFiles{CA: filepath.Join(dir, pki.CACertFile), Cert: filepath.Join(dir, pki.CertFile), Key: filepath.Join(dir, pki.KeyFile)}
	names := []string{}
	peers := map[string]string{}
	for i := range members {
		n := fmt.Sprintf("c%d", i+1)
		names = append(names, n)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		peers[n] = "https://" + ln.Addr().String()
		ln.Close()
	}
	var mu sync.Mutex
	started := map[string]*catalog.Embedded{}
	var errs []error
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, n := range names {
		d := b.TempDir()
		wg.Go(func() {
			e, err := catalog.StartEmbedded(sctx, catalog.EmbeddedOptions{Dir: d, Logger: quiet,
				Member: &catalog.Member{Name: n, Peers: peers, Token: "bench", TLS: files, PeerCN: rpc.CoordServerName}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("member %s: %w", n, err))
				return
			}
			started[n] = e
		})
	}
	wg.Wait()
	stop = func() {
		// Together: a member alone waits for the others to hear it out.
		var wg sync.WaitGroup
		for _, e := range started {
			wg.Go(func() { e.Close() })
		}
		wg.Wait()
	}
	if len(errs) > 0 {
		stop()
		b.Fatal(errors.Join(errs...))
	}
	for _, n := range names {
		all = append(all, started[n].Endpoints()...)
	}
	for _, n := range names {
		ep := started[n].Endpoints()
		lead, err := isRaftLeader(ctx, ep)
		if err != nil {
			stop()
			b.Fatal(err)
		}
		if lead == toLeader {
			return ep, all, stop
		}
	}
	stop()
	b.Fatalf("no member of %d is one that leads etcd's raft: %v", members, toLeader)
	return nil, nil, nil
}

// settle waits until every member at endpoints has applied what any of
// them had in its log when it was called: followers apply a write after
// the leader has answered it, and a round must not pay for the last
// one's (rounds are minutes apart in use).
func settle(ctx context.Context, cat *catalog.Catalog, endpoints []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var target uint64
	for _, ep := range endpoints {
		st, err := cat.Client().Status(ctx, ep)
		if err != nil {
			return err
		}
		target = max(target, st.RaftIndex)
	}
	for _, ep := range endpoints {
		for {
			st, err := cat.Client().Status(ctx, ep)
			if err != nil {
				return fmt.Errorf("member %s, waiting for index %d to be applied: %w", ep, target, err)
			}
			if st.RaftAppliedIndex >= target {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return nil
}

// cpuTime is the CPU time this process (the coordinator and every etcd
// member) has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// isRaftLeader reports whether the etcd member at endpoints leads its
// cluster's raft.
func isRaftLeader(ctx context.Context, endpoints []string) (bool, error) {
	cat, err := catalog.Open(ctx, catalog.Config{Endpoints: endpoints})
	if err != nil {
		return false, err
	}
	defer cat.Close()
	st, err := cat.Client().Status(ctx, endpoints[0])
	if err != nil {
		return false, err
	}
	if st.Leader == 0 {
		return false, fmt.Errorf("%s: no member leads etcd's raft", endpoints[0])
	}
	return st.Leader == st.Header.MemberId, nil
}

// replicatedRounds runs a coordinator on the etcd at endpoints, fenced by
// an election as control.leadership fences a leading one, with a job of
// ranks ranks on nodes in-memory agents, and returns t_coord (the ranks'
// freeze), the decision, the round's time and the CPU time it used (the
// coordinator's and every member's, until every member has applied its
// writes) of each of rounds rounds after a warm-up. all are the
// endpoints of every member.
func replicatedRounds(ctx context.Context, b *testing.B, endpoints, all []string, ranks, nodes, rounds int) (coords, decisions, took, cpus []time.Duration) {
	b.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := catalog.Config{Endpoints: endpoints}
	unfenced, err := catalog.Open(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer unfenced.Close()
	cand, err := unfenced.Candidate(ctx, 30*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer cand.Close()
	key, rev, err := cand.Campaign(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	cat, err := catalog.Open(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer cat.Close()
	cat.Fence(key, rev)
	mc := memagent.New(memagent.Options{Hold: 5 * time.Minute})
	for i := range nodes {
		mc.AddNode(fmt.Sprintf("n%04d", i))
	}
	// A long lease, as in BenchmarkRoundScale: 1,000 nodes' heartbeats,
	// one a node every 15 s.
	co := coord.New(cat, nil, nil, coord.Options{
		Deadline: 2 * time.Minute, NodeTTL: time.Minute,
		Dial: func(n coordv1.Node, term agentv1.Term) coord.Agent { return mc.Client("c", n.Name).WithTerm(term) },
	})
	wait := co.Start(ctx)
	defer wait()
	defer cancel()
	if co.Term().N == 0 {
		b.Fatal("the coordinator took no term from the catalog")
	}
	if err := mc.Join(ctx, co, 15*time.Second); err != nil {
		b.Fatal(err)
	}
	if _, err := co.RunJob(ctx, coordv1.RunJob{Name: "big", Ranks: ranks, Args: []string{"/bin/app"}}); err != nil {
		b.Fatal(err)
	}
	if err := settle(ctx, unfenced, all); err != nil {
		b.Fatal(err)
	}
	for i := range rounds + 1 {
		cpu0 := cpuTime()
		t0 := time.Now()
		ck, err := co.Checkpoint(ctx, "big", coordv1.CheckpointJob{})
		if err != nil {
			b.Fatalf("round %d of %d ranks: %v", i, ranks, err)
		}
		d := time.Since(t0)
		if ck.Stall <= 0 || ck.State != coordv1.CkptDurable && ck.State != coordv1.CkptProtected {
			b.Fatalf("round %d of %d ranks: %s, ranks frozen %s", i, ranks, ck.State, ck.Stall)
		}
		// The next round starts once this one's writes have ended, when
		// its checkpoint is protected.
		for deadline := time.Now().Add(2 * time.Minute); ; {
			cks, err := co.Checkpoints(ctx, "big")
			if err == nil && cks[len(cks)-1].State == coordv1.CkptProtected {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("round %d of %d ranks: checkpoint %d not protected within 2 min (%v)", i, ranks, ck.Seq, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := settle(ctx, unfenced, all); err != nil {
			b.Fatal(err)
		}
		cpu := cpuTime() - cpu0
		if i == 0 {
			continue // warm-up
		}
		coords, decisions, took, cpus = append(coords, ck.Stall), append(decisions, ck.Persist), append(took, d), append(cpus, cpu)
	}
	return coords, decisions, took, cpus
}
