package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/testbed"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// BenchmarkTakeOver measures how long a cluster of three coordinators
// (`cairn up --coordinators 3`) goes without one when the leader dies: a
// 2-rank ring on 2 nodes; CAIRN_BENCH_ROUNDS times (default 5), the
// leader takes a checkpoint (warm), is SIGKILLed, and the time is taken
// from the kill until `cairn checkpoint` (started again as soon as it
// fails) succeeds, a checkpoint the new leader committed: the take-over as
// a user sees it. Next to it: from the kill until `cairn coordinators`
// lists a new leader, and until when that leader says it took over (its
// record's since). The take-overs are also told apart by whether the
// dead coordinator's etcd member led etcd's raft (asked of etcd before
// each kill), and any node seen dead from the kill until a node TTL after
// the take-over is reported. The killed coordinator is started again and
// listed again before the next sample; at the end, the errors and
// warnings the coordinators logged are summed up.
//
// The baseline, in the same run, is how long the leader takes to see a
// node die: an agent is SIGKILLed, and the time taken until `cairn nodes`
// shows the node not alive, 3 times, next to the configured node TTL.
// The target is a take-over within twice the node TTL. Medians.
func BenchmarkTakeOver(b *testing.B) {
	rounds := envInt("CAIRN_BENCH_ROUNDS", 5)
	const nodeTTL = 4 * time.Second // cairn up's default, given so that it is known
	c := testutil.NewCluster(b, 2, "--coordinators", "3", "--node-ttl", nodeTTL.String())
	c.OK("run", "--job", "ring", "--ranks", "2", "--per-node", "1", "--", c.Bin, "ringapp", "-messages", "1000000000")
	c.WaitProgress("ring", 2, 0, time.Minute)

	var warm, takeover, listed, elected, rejoined []time.Duration
	// The take-overs split by whether the killed coordinator's etcd member
	// led etcd's raft: then etcd elects a raft leader first.
	var withRaft, withoutRaft []time.Duration
	failed := 0           // `cairn checkpoint` runs that failed during take-overs
	var nodeLost []string // nodes seen dead during take-overs
	var failures []string
	restarts := c.Job("ring").Restarts
	for i := range rounds {
		leader, term := c.WaitLeader(time.Minute)
		t0 := time.Now()
		c.OK("checkpoint", "ring")
		warm = append(warm, time.Since(t0))
		cks := c.Ckpts("ring")
		seq := cks[len(cks)-1].Seq

		// Who leads, polled meanwhile: when a new leader is first listed,
		// and when it says it took over.
		type seen struct {
			at, since time.Time
			name      string
		}
		stop := make(chan struct{})
		found := make(chan seen, 1)
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if list, err := c.Coordinators(); err == nil {
					for _, co := range list {
						if co.Leader && co.Name != leader.Name {
							found <- seen{time.Now(), co.Since, co.Name}
							return
						}
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()

		raft, err := etcdLeader(c.File().Coordinators, leader.Name)
		if err != nil {
			b.Fatal(err)
		}

		// Whether a node is seen dead meanwhile, from the kill until a
		// node TTL after the take-over: a node whose lease ran out while
		// no coordinator led.
		stopNodes := make(chan struct{})
		var lostMu sync.Mutex
		var lost []string
		nodesDone := make(chan struct{})

		start := time.Now()
		go func() {
			defer close(nodesDone)
			for {
				select {
				case <-stopNodes:
					return
				default:
				}
				if alive, err := nodesAlive(c); err == nil {
					for n, ok := range alive {
						if !ok {
							lostMu.Lock()
							lost = append(lost, fmt.Sprintf("%s at %s", n, time.Since(start).Round(time.Millisecond)))
							lostMu.Unlock()
						}
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		restart := c.KillCoordinatorNamed(leader.Name)
		for {
			out, err := c.Run("checkpoint", "ring")
			if err == nil {
				break
			}
			failed++
			failures = append(failures, fmt.Sprintf("round %d, %s after the kill: %v: %s", i, time.Since(start).Round(time.Millisecond), err, strings.TrimSpace(out)))
			if time.Since(start) > 2*time.Minute {
				close(stop)
				b.Fatalf("no checkpoint within 2 min of the leader %s's death:\n%s", leader.Name, strings.Join(failures, "\n"))
			}
		}
		took := time.Since(start)
		var s seen
		select {
		case s = <-found:
		case <-time.After(time.Minute):
			close(stop)
			b.Fatalf("a checkpoint succeeded %s after the leader %s's death, but no other coordinator is listed as leading", took, leader.Name)
		}
		close(stop)
		if s.since.IsZero() {
			b.Fatalf("the new leader %s's record says not when it took over", s.name)
		}
		next, nextTerm := c.WaitLeader(time.Minute, leader.Name)
		if nextTerm == term || next.Name != s.name {
			b.Fatalf("after %s (term %s) died, %s leads with term %s (%s was listed first)", leader.Name, term, next.Name, nextTerm, s.name)
		}
		cks = c.Ckpts("ring")
		if last := cks[len(cks)-1]; last.Seq <= seq || !last.Restorable() {
			b.Fatalf("after the take-over the last checkpoint is %d (%s), want one after %d, durable", last.Seq, last.State, seq)
		}
		takeover = append(takeover, took)
		if raft == leader.Name {
			withRaft = append(withRaft, took)
		} else {
			withoutRaft = append(withoutRaft, took)
		}
		listed = append(listed, s.at.Sub(start))
		elected = append(elected, s.since.Sub(start))
		b.Logf("round %d: %s (term %s; etcd's raft led by %s's member) killed; %s took over (term %s): elected at %s, listed at %s, checkpoint committed at %s",
			i, leader.Name, term, raft, next.Name, nextTerm, s.since.Sub(start).Round(time.Millisecond),
			s.at.Sub(start).Round(time.Millisecond), took.Round(time.Millisecond))

		time.Sleep(time.Until(start.Add(took + nodeTTL)))
		close(stopNodes)
		<-nodesDone
		if len(lost) > 0 {
			nodeLost = append(nodeLost, fmt.Sprintf("round %d: %s", i, strings.Join(lost, ", ")))
		}

		// The killed one back, listed as running, before the next sample.
		t0 = time.Now()
		restart()
		pid := 0
		for _, co := range c.File().Coordinators {
			if co.Name == leader.Name {
				pid = co.PID
			}
		}
		testutil.WaitUntil(b, 2*time.Minute, func() (bool, string) {
			list, err := c.Coordinators()
			if err != nil {
				return false, err.Error()
			}
			running := 0
			for _, co := range list {
				if co.PID != 0 && (co.Name != leader.Name || co.PID == pid) {
					running++
				}
			}
			return running == 3, fmt.Sprintf("%d coordinators of 3 run after %s's restart (pid %d): %+v", running, leader.Name, pid, list)
		})
		rejoined = append(rejoined, time.Since(t0))
		c.Moves("ring", 2, time.Minute)
	}
	if r := c.Job("ring").Restarts; r != restarts {
		b.Logf("the ring restarted %d times during the take-overs", r-restarts)
	}
	c.OK("rm", "-f", "ring")

	// The baseline: the death of a node, as the leader sees it.
	alive := func(node string) (bool, error) {
		all, err := nodesAlive(c)
		if err != nil {
			return false, err
		}
		ok, known := all[node]
		if !known {
			return false, fmt.Errorf("no node %s in %v", node, all)
		}
		return ok, nil
	}
	var detect []time.Duration
	for i := range 3 {
		node := c.Nodes[i%len(c.Nodes)]
		if ok, err := alive(node); err != nil || !ok {
			b.Fatalf("node %s before its agent is killed: alive %v, %v", node, ok, err)
		}
		leader, _ := c.WaitLeader(time.Minute)
		var since time.Time
		if list, err := c.Coordinators(); err == nil {
			for _, co := range list {
				if co.Name == leader.Name {
					since = co.Since
				}
			}
		}
		logged := strings.Count(c.CoordLog(leader.Name), `msg="node lost"`)
		start := time.Now()
		restart := c.KillAgent(node)
		testutil.WaitUntil(b, time.Minute, func() (bool, string) {
			ok, err := alive(node)
			if err != nil {
				return false, err.Error()
			}
			return !ok, fmt.Sprintf("node %s still alive %s after its agent was killed", node, time.Since(start).Round(time.Millisecond))
		})
		detect = append(detect, time.Since(start))
		restart()
		c.WaitNodes(len(c.Nodes), time.Minute)
		b.Logf("baseline %d: %s's agent killed %s after %s took over; seen dead at %s; %s logged it lost: %v",
			i, node, start.Sub(since).Round(time.Millisecond), leader.Name, detect[i].Round(time.Millisecond), leader.Name,
			strings.Count(c.CoordLog(leader.Name), `msg="node lost"`) > logged)
	}

	to, ttl := median(takeover), nodeTTL
	ratio := float64(to) / float64(ttl)
	b.Logf("take-over (from the leader's SIGKILL until a checkpoint committed by the next leader): %s; a new leader listed: %s; its own record says it took over at %s (medians of %d)",
		to.Round(time.Millisecond), median(listed).Round(time.Millisecond), median(elected).Round(time.Millisecond), len(takeover))
	b.Logf("a checkpoint with a live leader: %s; the killed coordinator running and listed again after its restart: %s; `cairn checkpoint` runs that failed during the take-overs: %d",
		median(warm).Round(time.Millisecond), median(rejoined).Round(time.Millisecond), failed)
	for _, f := range failures {
		b.Logf("  %s", f)
	}
	for _, part := range []struct {
		what string
		ds   []time.Duration
	}{{"led etcd's raft", withRaft}, {"did not lead etcd's raft", withoutRaft}} {
		if len(part.ds) > 0 {
			b.Logf("take-over when the killed coordinator's etcd member %s: %s (median of %d)", part.what, median(part.ds).Round(time.Millisecond), len(part.ds))
		}
	}
	if len(nodeLost) > 0 {
		b.Logf("nodes seen dead during the take-overs (their agents ran throughout): %s", strings.Join(nodeLost, "; "))
	} else {
		b.Logf("no node was seen dead during the take-overs (from the kill until a node TTL after the checkpoint)")
	}
	b.Logf("baseline: a node's death seen %s after its agent's SIGKILL (median of %d); node TTL %s", median(detect).Round(time.Millisecond), len(detect), ttl)
	verdict := "met"
	if ratio > 2 {
		verdict = "NOT met"
	}
	b.Logf("take-over / node TTL = %.2f; take-over / node-loss detection = %.2f; target take-over <= 2x node TTL (%s): %s",
		ratio, float64(to)/float64(median(detect)), 2*ttl, verdict)
	for _, co := range c.File().Coordinators {
		for _, line := range logProblems(c.CoordLog(co.Name)) {
			b.Logf("coordinator %s logged %s", co.Name, line)
		}
	}
	b.ReportMetric(ms(to), "takeover-ms")
	b.ReportMetric(ms(median(listed)), "leader-listed-ms")
	b.ReportMetric(ms(median(detect)), "node-loss-ms")
	b.ReportMetric(ratio, "takeover/node-ttl")
}

// nodesAlive is whether each node is alive, as `cairn nodes` says.
func nodesAlive(c *testutil.Cluster) (map[string]bool, error) {
	out, err := c.Run("nodes", "--json")
	if err != nil {
		return nil, fmt.Errorf("cairn nodes: %v: %s", err, out)
	}
	var nodes []struct {
		Name  string `json:"name"`
		Alive bool   `json:"alive"`
	}
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		return nil, fmt.Errorf("cairn nodes: %v: %s", err, out)
	}
	alive := map[string]bool{}
	for _, n := range nodes {
		alive[n.Name] = n.Alive
	}
	return alive, nil
}

// etcdLeader names the coordinator whose etcd member leads etcd's raft,
// as the member of a coordinator other than not says.
func etcdLeader(cos []testbed.Coord, not string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for _, co := range cos {
		sock := filepath.Join(co.Dir, "etcd", "etcd.sock")
		if co.Name == not {
			continue
		}
		if _, err := os.Stat(sock); err != nil {
			errs = append(errs, err)
			continue
		}
		name, err := raftLeader(ctx, "unix://"+sock)
		if err == nil {
			return name, nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("which etcd member leads: %w", errors.Join(errs...))
}

// raftLeader names the member that leads etcd's raft, as the member at
// the endpoint ep says.
func raftLeader(ctx context.Context, ep string) (string, error) {
	cat, err := catalog.Open(ctx, catalog.Config{Endpoints: []string{ep}})
	if err != nil {
		return "", err
	}
	defer cat.Close()
	st, err := cat.Client().Status(ctx, ep)
	if err != nil {
		return "", err
	}
	ms, err := cat.Client().MemberList(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range ms.Members {
		if m.ID == st.Leader {
			return m.Name, nil
		}
	}
	return "", fmt.Errorf("%s: no member %x leads", ep, st.Leader)
}

var problemRE = regexp.MustCompile(`level=(ERROR|WARN) msg=("(?:[^"\\]|\\.)*"|\S+)(.*)`)

// logProblems sums up the errors and warnings of a log: each message
// once, with how many times it came and its first line's attributes.
func logProblems(log string) []string {
	count := map[string]int{}
	first := map[string]string{}
	for _, m := range problemRE.FindAllStringSubmatch(log, -1) {
		k := m[1] + " " + m[2]
		if count[k] == 0 {
			first[k] = strings.TrimSpace(m[3])
		}
		count[k]++
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		a := first[k]
		if len(a) > 300 {
			a = a[:300] + "..."
		}
		out = append(out, fmt.Sprintf("%s (%d times; first: %s)", k, count[k], a))
	}
	return out
}
