package testutil

import (
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

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/testbed"
)

// Cluster is a local cluster made by `cairn up` for one test.
type Cluster struct {
	t       testing.TB
	Bin     string // the cairn binary
	Data    string // the data dir of every cairn command
	Staging string
	Prefix  string
	Nodes   []string
	placed  map[string][]string // the last placement status saw, by job
}

func randBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// NewCluster starts a cluster of n nodes; extra flags go to `cairn up`. It
// is removed when the test ends, and nothing of it may be left.
func NewCluster(t testing.TB, n int, extra ...string) *Cluster {
	t.Helper()
	RequiresRoot(t)
	r := randBytes(t, 3)
	c := &Cluster{
		t:       t,
		Bin:     CairnBinary(t),
		Data:    t.TempDir(),
		Staging: "/dev/shm/cairn-e2e-" + hex.EncodeToString(r),
		Prefix:  "e" + hex.EncodeToString(r[:2]) + "-",
	}
	// Cleanups run last-in first-out: the underlay is released after the
	// cluster is down.
	underlay := fmt.Sprintf("10.218.%d.0/24", reserveUnderlay(t, r[2]))
	jobs := fmt.Sprintf("10.%d.%d.0/20", 232+r[0]%8, r[1]%16*16)
	t.Cleanup(c.down)
	out := c.OK(append([]string{"up", "--json", "--nodes", strconv.Itoa(n), "--prefix", c.Prefix, "--underlay", underlay, "--job-subnets", jobs}, extra...)...)
	var up testbed.Cluster
	if err := json.Unmarshal([]byte(out), &up); err != nil || len(up.Nodes) != n {
		t.Fatalf("up --json: %v, %d nodes, want %d:\n%s", err, len(up.Nodes), n, out)
	}
	for _, nd := range up.Nodes {
		c.Nodes = append(c.Nodes, nd.Name)
	}
	return c
}

// underlayLocks is where test processes on this host hold the underlay
// subnets of their clusters.
var underlayLocks = filepath.Join(os.TempDir(), "cairn-e2e-underlays")

// reserveUnderlay returns the third byte X of an underlay subnet
// 10.218.X.0/24 that no other cluster of a test on this host uses, trying
// from the byte first on, and holds it until the test ends. The host routes
// every underlay through its cluster's bridge, and every coordinator
// listens on its underlay's gateway: two clusters on one subnet at once
// (end-to-end packages run side by side) would take each other's
// addresses.
func reserveUnderlay(t testing.TB, first byte) byte {
	t.Helper()
	if err := os.MkdirAll(underlayLocks, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := range 256 {
		x := first + byte(i)
		f, err := os.OpenFile(filepath.Join(underlayLocks, strconv.Itoa(int(x))), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		t.Cleanup(func() { f.Close() })
		return x
	}
	t.Fatalf("every underlay subnet 10.218.X.0/24 is taken by clusters of other tests (%s)", underlayLocks)
	return 0
}

// Gateway is the host's address on the cluster's underlay: what its
// nodes reach the host at (the coordinator listens there).
func (c *Cluster) Gateway() string {
	c.t.Helper()
	p, err := netip.ParsePrefix(c.File().Underlay)
	if err != nil {
		c.t.Fatal(err)
	}
	return p.Masked().Addr().Next().String()
}

// File is the cluster's record (cluster.json), as it is now.
func (c *Cluster) File() *testbed.Cluster {
	c.t.Helper()
	f, err := testbed.Load(testbed.Dir(c.Data))
	if err != nil {
		c.t.Fatal(err)
	}
	return f
}

// down removes the cluster and checks that nothing of it is left:
// processes, namespaces, links, mounts, cgroups.
func (c *Cluster) down() {
	t := c.t
	f, err := testbed.Load(testbed.Dir(c.Data))
	if err != nil {
		return // up failed before it wrote anything
	}
	if t.Failed() {
		c.dumpLogs(f)
	}
	type inst struct{ data, id string }
	var insts []inst
	for _, n := range f.Nodes {
		if id, err := os.ReadFile(filepath.Join(n.Data, "instance")); err == nil {
			insts = append(insts, inst{n.Data, strings.TrimSpace(string(id))})
		}
	}
	if out, err := c.Run("down"); err != nil {
		t.Errorf("cairn down: %v\n%s", err, out)
	}
	for _, in := range insts {
		CheckNoLeaks(t, in.data, in.id)
	}
	for _, pid := range f.PIDs() {
		if testbed.Running(pid) {
			t.Errorf("cluster process %d still runs", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if ents, _ := os.ReadDir(netw.NetnsDir); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), c.Prefix) {
				t.Errorf("leaked netns %s", e.Name())
			}
		}
	}
	if ents, _ := os.ReadDir("/sys/class/net"); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), c.Prefix) {
				t.Errorf("leaked link %s", e.Name())
			}
		}
	}
	os.RemoveAll(c.Staging)
	if _, err := os.Stat(filepath.Join(c.Data, "cluster")); err == nil {
		t.Errorf("cluster dir left behind")
	}
}

// dumpLogs shows the tail of the coordinators' and every agent's log in
// the test's output, and with CAIRN_TEST_LOGS=DIR keeps them whole there:
// what a failed end-to-end run needs to be understood afterwards.
func (c *Cluster) dumpLogs(f *testbed.Cluster) {
	logs := map[string]string{"coordinator": f.CoordinatorLog()}
	if len(f.Coordinators) > 1 {
		logs = map[string]string{}
		for _, co := range f.Coordinators {
			logs["coordinator "+co.Name] = co.Log()
		}
	}
	for _, n := range f.Nodes {
		logs[n.Name] = f.AgentLog(n.Name)
	}
	keep := os.Getenv("CAIRN_TEST_LOGS")
	for _, name := range slices.Sorted(maps.Keys(logs)) {
		b, err := os.ReadFile(logs[name])
		if err != nil {
			continue
		}
		if keep != "" {
			dir := filepath.Join(keep, strings.NewReplacer("/", "_").Replace(c.t.Name()))
			if os.MkdirAll(dir, 0o755) == nil {
				_ = os.WriteFile(filepath.Join(dir, name+".log"), b, 0o644)
			}
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		c.t.Logf("last lines of the %s log:\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}

// waitGone waits until a killed process has exited.
func waitGone(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for testbed.Running(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs 10s after SIGKILL", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Run runs the cairn binary against the cluster.
func (c *Cluster) Run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Bin, append([]string{"--data", c.Data, "--staging", c.Staging}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *Cluster) OK(args ...string) string {
	c.t.Helper()
	out, err := c.Run(args...)
	if err != nil {
		c.t.Fatalf("cairn %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// JobStatus is `cairn ps --job NAME --json`.
type JobStatus struct {
	State      string   `json:"state"`
	Placement  []string `json:"placement"`
	RankStates []struct {
		Rank     int    `json:"rank"`
		Node     string `json:"node"`
		Status   string `json:"status"`
		Pid      int    `json:"pid"`
		ExitCode *int   `json:"exit_code"`
	} `json:"rank_states"`
}

// Unused is the last of the cluster's nodes that holds no rank of
// placement ("": every node holds one).
func (c *Cluster) Unused(placement []string) string {
	free := ""
	for _, n := range c.Nodes {
		if !slices.Contains(placement, n) {
			free = n
		}
	}
	return free
}

func (c *Cluster) Status(job string) JobStatus {
	c.t.Helper()
	var st JobStatus
	if err := json.Unmarshal([]byte(c.OK("ps", "--job", job, "--json")), &st); err != nil {
		c.t.Fatal(err)
	}
	if c.placed == nil {
		c.placed = map[string][]string{}
	}
	c.placed[job] = st.Placement
	return st
}

// Ckpt is one line of `cairn checkpoints JOB --json`.
type Ckpt struct {
	Seq    int    `json:"seq"`
	State  string `json:"state"`
	Reason string `json:"reason"`
	Ranks  []struct {
		Rank   int      `json:"rank"`
		Node   string   `json:"node"`
		State  string   `json:"state"`
		Copies []string `json:"copies"`
		Size   int64    `json:"size"` // the image's bytes
		// MemoryWait is how long the rank's lazy restore was waited for.
		MemoryWait time.Duration `json:"memory_wait_ns"`
	} `json:"ranks"`
	Stall int64 `json:"stall_ns"`
	Coord int64 `json:"coord_ns"`
	// Unavailable: ranks with no copy on a live node.
	Unavailable []int `json:"unavailable"`
}

func (c *Cluster) Ckpts(job string) []Ckpt {
	c.t.Helper()
	var out []Ckpt
	if err := json.Unmarshal([]byte(c.OK("checkpoints", job, "--json")), &out); err != nil {
		c.t.Fatal(err)
	}
	return out
}

// Restorable says whether a restart may use the checkpoint: it is durable,
// or protected (durable and replicated), and every rank has a copy on a
// live node.
func (ck Ckpt) Restorable() bool {
	return (ck.State == "durable" || ck.State == "protected") && len(ck.Unavailable) == 0
}

// WaitProtected waits until the job's newest checkpoint is protected:
// every rank image has its copies on live nodes. It returns that
// checkpoint.
func (c *Cluster) WaitProtected(job string, within time.Duration) Ckpt {
	c.t.Helper()
	var last Ckpt
	WaitUntil(c.t, within, func() (bool, string) {
		cks := c.Ckpts(job)
		last = cks[len(cks)-1]
		return last.State == "protected", fmt.Sprintf("checkpoint %d is %s, not protected: %+v", last.Seq, last.State, last.Ranks)
	})
	return last
}

// RingMessages sizes the ring job so that it runs for about 15-30 s on
// four ranks here: long enough for checkpoints and a restart mid-run.
const RingMessages = 1_000_000

// RingArgs is the end of a `cairn run` of the ring job (`cairn ringapp`)
// passing messages messages.
func (c *Cluster) RingArgs(messages int) []string {
	return []string{"--", c.Bin, "ringapp", "-messages", strconv.Itoa(messages)}
}

// ReleaseRing lets a ring job started with `ringapp -hold K` go on past
// its K-th message: SIGUSR1 to rank 0's process, through this host's pid
// of it (every node of the cluster is a namespace of this host).
func (c *Cluster) ReleaseRing(job string) {
	c.t.Helper()
	for _, r := range c.Status(job).RankStates {
		if r.Rank != 0 {
			continue
		}
		if r.Pid <= 0 {
			c.t.Fatalf("rank 0 of %s has no process to release: %+v", job, r)
		}
		if err := syscall.Kill(r.Pid, syscall.SIGUSR1); err != nil {
			c.t.Fatalf("release rank 0 of %s (pid %d): %v", job, r.Pid, err)
		}
		return
	}
	c.t.Fatalf("job %s has no rank 0", job)
}

var progressRE = regexp.MustCompile(`rank (\d+): (\d+)/(\d+) msgs`)

// Logs returns a rank's output: through the cluster, or, when its
// coordinator is down, from the rank's log file on the node it was last
// seen on.
func (c *Cluster) Logs(job string, rank int) string {
	out, err := c.Run("logs", fmt.Sprintf("%s/%d", job, rank))
	if err == nil {
		return out
	}
	if p := c.placed[job]; rank < len(p) {
		f, err := testbed.Load(testbed.Dir(c.Data))
		if err != nil {
			return ""
		}
		n, _ := f.Node(p[rank])
		b, _ := os.ReadFile(filepath.Join(n.Data, "containers", fmt.Sprintf("%s.%d", job, rank), "container.log"))
		return string(b)
	}
	return ""
}

// Progress returns the last message count a rank logged.
func (c *Cluster) Progress(job string, rank int) int {
	c.t.Helper()
	out := c.Logs(job, rank)
	m := progressRE.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][2])
	return n
}

// WaitProgress waits until every rank has logged more than min messages.
func (c *Cluster) WaitProgress(job string, ranks, min int, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for r := 0; r < ranks; r++ {
		for c.Progress(job, r) <= min {
			if time.Now().After(deadline) {
				c.t.Fatalf("rank %d of %s made no progress past %d messages within %s\n%s", r, job, min, within, c.Logs(job, r))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

var resultRE = regexp.MustCompile(`result=([0-9a-f]+)`)

// Result waits for the job to end and returns rank 0's result.
func (c *Cluster) Result(job string) string {
	c.t.Helper()
	if out, err := c.Run("wait", job); err != nil {
		for r := range len(c.Status(job).RankStates) {
			out += fmt.Sprintf("\n--- rank %d:\n%s", r, c.OK("logs", fmt.Sprintf("%s/%d", job, r)))
		}
		c.t.Fatalf("cairn wait %s: %v\n%s", job, err, out)
	}
	m := resultRE.FindStringSubmatch(c.OK("logs", job+"/0"))
	if m == nil {
		c.t.Fatalf("no result in rank 0's log:\n%s", c.OK("logs", job+"/0"))
	}
	return m[1]
}

// WaitNodes waits until the coordinator sees want nodes alive.
func (c *Cluster) WaitNodes(want int, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, err := c.Run("nodes", "--json")
		var nodes []struct {
			Alive bool `json:"alive"`
		}
		alive := 0
		if err == nil && json.Unmarshal([]byte(out), &nodes) == nil {
			for _, n := range nodes {
				if n.Alive {
					alive++
				}
			}
			if alive == want {
				return
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(c.File().CoordinatorLog())
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			c.t.Fatalf("%d nodes alive, want %d: %v %s\ncoordinator log:\n%s", alive, want, err, out, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// CheckpointAsync starts `cairn checkpoint JOB` and returns a channel that
// yields its output and error when it ends.
func (c *Cluster) CheckpointAsync(job string) <-chan error {
	ch := make(chan error, 1)
	cmd := exec.Command(c.Bin, "--data", c.Data, "--staging", c.Staging, "checkpoint", job)
	go func() {
		out, err := cmd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, out)
		}
		ch <- err
	}()
	return ch
}

// Moves waits until every rank's message count grows past what it was.
func (c *Cluster) Moves(job string, ranks int, within time.Duration) {
	c.t.Helper()
	min := c.Progress(job, 0)
	for r := 1; r < ranks; r++ {
		if p := c.Progress(job, r); p < min {
			min = p
		}
	}
	c.WaitProgress(job, ranks, min, within)
}

// RankNetns lists the network namespaces of a job's ranks.
func (c *Cluster) RankNetns(job string) []string {
	c.t.Helper()
	var jobs []struct {
		Name      string   `json:"name"`
		VNI       uint32   `json:"vni"`
		Addrs     []string `json:"addrs"`
		Placement []string `json:"placement"`
	}
	if err := json.Unmarshal([]byte(c.OK("jobs", "--json")), &jobs); err != nil {
		c.t.Fatal(err)
	}
	var out []string
	for _, j := range jobs {
		if j.Name != job {
			continue
		}
		for r, a := range j.Addrs {
			n := netw.NodeJobNet{VNI: j.VNI, Prefix: j.Placement[r] + "-"}
			out = append(out, netw.NetnsPath(n.RankNetns(netip.MustParseAddr(a))))
		}
	}
	return out
}

// WaitFailpoint waits until the coordinator's log says it hangs at a
// failpoint.
func (c *Cluster) WaitFailpoint(name string, within time.Duration) {
	c.t.Helper()
	log := c.File().CoordinatorLog()
	deadline := time.Now().Add(within)
	for {
		b, _ := os.ReadFile(log)
		if strings.Contains(string(b), "failpoint="+name) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the coordinator never reached failpoint %s:\n%s", name, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitAgentLog waits until a node's agent has logged substr.
func (c *Cluster) WaitAgentLog(node, substr string, within time.Duration) {
	c.t.Helper()
	log := c.File().AgentLog(node)
	WaitUntil(c.t, within, func() (bool, string) {
		b, _ := os.ReadFile(log)
		return strings.Contains(string(b), substr), fmt.Sprintf("agent of %s never logged %q", node, substr)
	})
}

// AgentLog is what a node's agent has logged so far.
func (c *Cluster) AgentLog(node string) string {
	c.t.Helper()
	b, err := os.ReadFile(c.File().AgentLog(node))
	if err != nil {
		c.t.Fatal(err)
	}
	return string(b)
}

// CoordinatorLog is what the coordinator has logged so far.
func (c *Cluster) CoordinatorLog() string {
	c.t.Helper()
	b, err := os.ReadFile(c.File().CoordinatorLog())
	if err != nil {
		c.t.Fatal(err)
	}
	return string(b)
}

// WaitUntil polls cond until it holds, failing t with its message after within.
func WaitUntil(t testing.TB, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Job is what `cairn jobs --json` says of a job.
type Job struct {
	Name      string   `json:"name"`
	State     string   `json:"state"`
	Reason    string   `json:"reason"`
	Placement []string `json:"placement"`
	Restarts  int      `json:"restarts"`
	// RestoredFrom is the checkpoint the job last restarted from.
	RestoredFrom int `json:"restored_from"`
}

// Job returns a job as the coordinator records it.
func (c *Cluster) Job(name string) Job {
	c.t.Helper()
	var jobs []Job
	if err := json.Unmarshal([]byte(c.OK("jobs", "--json")), &jobs); err != nil {
		c.t.Fatal(err)
	}
	for _, j := range jobs {
		if j.Name == name {
			return j
		}
	}
	c.t.Fatalf("no job %s", name)
	return Job{}
}

// Repo is the image repo of a node (its checkpoints and its store), read
// on the node's disk.
func (c *Cluster) Repo(node string) image.Repo {
	c.t.Helper()
	n, ok := c.File().Node(node)
	if !ok {
		c.t.Fatalf("no node %s", node)
	}
	return image.Repo{Dir: filepath.Join(n.Data, "checkpoints"), StoreDir: filepath.Join(n.Data, "store")}
}

// Agent returns a client of a node's agent, authenticated as the
// cluster's client (`cairn up` made its credentials).
func (c *Cluster) Agent(node string) *rpc.AgentClient {
	c.t.Helper()
	creds, err := pki.LoadCredentials(filepath.Join(c.Data, "cluster", "client"))
	if err != nil {
		c.t.Fatal(err)
	}
	for _, n := range c.File().Nodes {
		if n.Name == node {
			return rpc.NewAgentClient(n.Addr, n.Name, creds)
		}
	}
	c.t.Fatalf("no node %s", node)
	return nil
}
