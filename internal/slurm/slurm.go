// Package slurm brings a cairn cluster up inside a Slurm allocation and
// takes it down again (cairn slurm up, down, agent; deploy/slurm): the
// coordinator on the batch node, an agent on every allocated node started
// with srun, a CA of the allocation's own. A job then runs on it with the
// usual commands, and outlives the allocation through its durable tier
// (docs/hpc.md).
//
// The allocation's directory (Up's Dir) holds the CA and the clients'
// credentials: it must be on a file system every node of the allocation
// reads (the submit directory, a home directory), readable by its owner
// only. Each node's data stays on the node (Local).
package slurm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cairn-hpc/cairn/internal/durable"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/proc"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// Ports the allocation's cairn serves on, on each node's address.
const (
	CoordPort = 7400
	AgentPort = 7420
)

// ErrNotInAllocation is returned outside a Slurm allocation.
var ErrNotInAllocation = errors.New("not inside a Slurm allocation (no SLURM_JOB_ID and SLURM_JOB_NODELIST): run this in an sbatch script or salloc")

// Allocation is the Slurm allocation this process runs in.
type Allocation struct {
	JobID string   // SLURM_JOB_ID
	Nodes []string // its nodes, as Slurm names them
}

// Current returns the allocation this process runs in.
func Current(ctx context.Context) (Allocation, error) {
	a := Allocation{JobID: os.Getenv("SLURM_JOB_ID")}
	list := os.Getenv("SLURM_JOB_NODELIST")
	if a.JobID == "" || list == "" {
		return a, ErrNotInAllocation
	}
	out, err := exec.CommandContext(ctx, "scontrol", "show", "hostnames", list).Output()
	if err != nil {
		return a, fmt.Errorf("scontrol show hostnames %s: %w", list, err)
	}
	a.Nodes = strings.Fields(string(out))
	if len(a.Nodes) == 0 {
		return a, fmt.Errorf("allocation %s has no nodes (%q)", a.JobID, list)
	}
	return a, nil
}

// DefaultDir is the allocation's directory: .cairn/JOBID in the directory
// the job was submitted from.
func (a Allocation) DefaultDir() string {
	base := os.Getenv("SLURM_SUBMIT_DIR")
	if base == "" {
		base, _ = os.Getwd()
	}
	return filepath.Join(base, ".cairn", a.JobID)
}

// DefaultLocal is where each node keeps its data: $TMPDIR (or /tmp).
func DefaultLocal() string {
	if d := os.Getenv("TMPDIR"); d != "" {
		return d
	}
	return os.TempDir()
}

// Config says how Up brings the cluster up.
type Config struct {
	Exe   string // this cairn binary, as every node runs it
	Dir   string // the allocation's directory, on a shared file system
	Local string // node-local directory for the nodes' data
	// JoinWithin bounds the wait for every node's agent to join.
	JoinWithin time.Duration
	// Extra are global flags for every cairn process (--criu, --runc).
	Extra []string
}

// state is what Up leaves in Dir for Down.
type state struct {
	JobID       string `json:"job_id"`
	Coordinator string `json:"coordinator"` // host:port
	CoordPID    int    `json:"coord_pid"`
	SrunPID     int    `json:"srun_pid"`
	Local       string `json:"local"` // the coordinator's data, on this node
}

func statePath(dir string) string { return filepath.Join(dir, "cluster.json") }

// ClientCreds is the CLI's credentials for the allocation's cluster.
func ClientCreds(dir string) string { return filepath.Join(dir, "client") }

// Up brings the allocation's cluster up: a CA, the coordinator on this
// node, and an agent on every node of the allocation (one srun step). It
// returns the coordinator's address once every agent has joined; on
// error, what it started is stopped.
func Up(ctx context.Context, a Allocation, cfg Config) (addr string, err error) {
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return "", err
	}
	if _, err := os.Stat(statePath(cfg.Dir)); err == nil {
		return "", fmt.Errorf("a cluster of allocation %s is up already (%s): cairn slurm down first", a.JobID, cfg.Dir)
	}
	ip, err := LocalIP()
	if err != nil {
		return "", err
	}
	addr = net.JoinHostPort(ip.String(), fmt.Sprint(CoordPort))
	ca, err := pki.Init(filepath.Join(cfg.Dir, "pki"), pki.InitOptions{Force: true})
	if err != nil {
		return "", err
	}
	issue := func(name string, role pki.Role, to string, ips ...net.IP) error {
		c, err := ca.Issue(name, role, pki.IssueOptions{IPs: ips})
		if err != nil {
			return err
		}
		return c.Write(to)
	}
	if err := issue(rpc.CoordServerName, pki.Coordinator, filepath.Join(cfg.Dir, "coordinator"), ip); err != nil {
		return "", err
	}
	if err := issue("client", pki.Client, ClientCreds(cfg.Dir)); err != nil {
		return "", err
	}
	st := state{JobID: a.JobID, Coordinator: addr, Local: filepath.Join(cfg.Local, "cairn-"+a.JobID+"-coordinator")}
	defer func() {
		if err != nil {
			stop(st)
			os.Remove(statePath(cfg.Dir))
		}
	}()
	coord := append(append([]string{cfg.Exe}, cfg.Extra...), "--data", st.Local, "coordinator",
		"--creds", filepath.Join(cfg.Dir, "coordinator"), "--dir", st.Local, "--listen", addr)
	if st.CoordPID, err = spawn(filepath.Join(cfg.Dir, "coordinator.log"), coord); err != nil {
		return "", err
	}
	n := fmt.Sprint(len(a.Nodes))
	agents := append([]string{"srun", "--job-name=" + agentStep, "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=0", "--export=ALL",
		cfg.Exe}, cfg.Extra...)
	agents = append(agents, "slurm", "agent", "--dir", cfg.Dir, "--coordinator", addr, "--local", cfg.Local)
	if st.SrunPID, err = spawn(filepath.Join(cfg.Dir, "agents.log"), agents); err != nil {
		return "", err
	}
	b, _ := json.Marshal(st)
	if err := durable.WriteFile(statePath(cfg.Dir), b, 0o600); err != nil {
		return "", err
	}
	return addr, waitJoined(ctx, cfg, addr, len(a.Nodes))
}

// waitJoined waits until n nodes are alive.
func waitJoined(ctx context.Context, cfg Config, addr string, n int) error {
	creds, err := pki.LoadCredentials(ClientCreds(cfg.Dir))
	if err != nil {
		return err
	}
	c := rpc.NewCoordClient(addr, creds)
	defer c.Close()
	within := cfg.JoinWithin
	if within == 0 {
		within = 2 * time.Minute
	}
	deadline := time.Now().Add(within)
	alive := 0
	for {
		if nodes, err := c.Nodes(ctx); err == nil {
			alive = 0
			for _, nd := range nodes {
				if nd.Alive {
					alive++
				}
			}
			if alive >= n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d nodes joined within %v (see %s and %s)", alive, n, within,
				filepath.Join(cfg.Dir, "coordinator.log"), filepath.Join(cfg.Dir, "agents.log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Down takes the allocation's cluster down: the agents (their srun step),
// then the coordinator and its data. A cluster already down is no error.
func Down(dir string) error {
	b, err := os.ReadFile(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("%s: %w", statePath(dir), err)
	}
	stop(st)
	return os.Remove(statePath(dir))
}

// agentStep is the name of the agents' srun step.
const agentStep = "cairn-agents"

// stop ends what Up started, agents first. srun answers SIGTERM by
// killing its step's tasks outright, which would leave each node's data
// behind: the agents are sent SIGTERM through Slurm first (scancel), to
// stop and remove their data, and srun only after.
func stop(st state) {
	if st.SrunPID > 0 && proc.Runs(st.SrunPID) {
		if step := agentStepID(st.JobID); step != "" {
			_ = exec.Command("scancel", "--signal=TERM", step).Run()
			wait(st.SrunPID, time.Minute)
		}
	}
	for _, pid := range []int{st.SrunPID, st.CoordPID} {
		if pid > 0 {
			end(pid, 30*time.Second)
		}
	}
	if st.Local != "" {
		os.RemoveAll(st.Local)
	}
}

// agentStepID is the id (JOB.STEP) of job's step of agents, or "".
func agentStepID(job string) string {
	out, err := exec.Command("squeue", "-h", "-s", "-j", job, "-o", "%i %j").Output()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(out), "\n") {
		if id, name, ok := strings.Cut(strings.TrimSpace(line), " "); ok && name == agentStep {
			return id
		}
	}
	return ""
}

// end sends pid SIGTERM, and SIGKILL if it has not exited within d.
func end(pid int, d time.Duration) {
	if !proc.Runs(pid) {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	if !wait(pid, d) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// wait waits up to d for pid to exit, and says whether it has.
func wait(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for proc.Runs(pid) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	return !proc.Runs(pid)
}

// spawn starts argv in a session of its own, its output appended to log.
func spawn(log string, argv []string) (int, error) {
	lf, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer lf.Close()
	c := exec.Command(argv[0], argv[1:]...)
	c.Stdout, c.Stderr = lf, lf
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", argv[0], err)
	}
	go func() { _ = c.Wait() }()
	return c.Process.Pid, nil
}

// AgentConfig says how Agent runs a node's agent.
type AgentConfig struct {
	Exe         string
	Dir         string // the allocation's directory (its CA)
	Coordinator string
	Local       string
	Extra       []string
}

// Agent runs this node's agent (srun starts it on every node): it issues
// the node's credentials from the allocation's CA, runs the agent with its
// data and staging on the node, and removes them when the agent ends
// (SIGTERM through Slurm, at cairn slurm down).
func Agent(ctx context.Context, cfg AgentConfig) error {
	name := strings.ToLower(os.Getenv("SLURMD_NODENAME"))
	if name == "" {
		return ErrNotInAllocation
	}
	if err := pki.ValidateName(name); err != nil {
		return fmt.Errorf("node %q: %w", name, err)
	}
	ip, err := LocalIP()
	if err != nil {
		return err
	}
	ca, err := pki.Load(filepath.Join(cfg.Dir, "pki"))
	if err != nil {
		return fmt.Errorf("the allocation's CA: %w (is %s on a file system every node reads?)", err, cfg.Dir)
	}
	local := filepath.Join(cfg.Local, "cairn-"+os.Getenv("SLURM_JOB_ID")+"-"+name)
	staging := filepath.Join("/dev/shm", "cairn-"+os.Getenv("SLURM_JOB_ID")+"-"+name)
	defer os.RemoveAll(local)
	defer os.RemoveAll(staging)
	creds, err := ca.Issue(name, pki.Agent, pki.IssueOptions{IPs: []net.IP{ip}})
	if err != nil {
		return err
	}
	if err := creds.Write(filepath.Join(local, "creds")); err != nil {
		return err
	}
	// Ranks see nothing of the allocation's directory (the CA's key) nor
	// of the node's data.
	argv := append(append([]string{}, cfg.Extra...), "--data", filepath.Join(local, "data"), "--staging", staging,
		"--hide", cfg.Dir, "--hide", local, "agent", "--creds", filepath.Join(local, "creds"),
		"--listen", net.JoinHostPort(ip.String(), fmt.Sprint(AgentPort)), "--coordinator", cfg.Coordinator,
		"--underlay", ip.String(), "--netns-prefix", name+"-")
	c := exec.CommandContext(ctx, cfg.Exe, argv...)
	c.Stdout, c.Stderr = os.Stdout, os.Stderr
	if err := c.Start(); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	for {
		select {
		case s := <-sigs:
			_ = c.Process.Signal(s)
		case err := <-done:
			return err
		}
	}
}

// LocalIP is this node's address: the IPv4 address of the interface its
// default route goes out of (where the other nodes reach it), else the
// first IPv4 address, not loopback, of an interface that is up.
func LocalIP() (net.IP, error) {
	if b, err := os.ReadFile("/proc/net/route"); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 2 && f[1] == "00000000" {
				if ip := ifaceIP(f[0]); ip != nil {
					return ip, nil
				}
			}
		}
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp != 0 && i.Flags&net.FlagLoopback == 0 {
			if ip := ifaceIP(i.Name); ip != nil {
				return ip, nil
			}
		}
	}
	return nil, errors.New("no IPv4 address on this node")
}

// ifaceIP is the first global IPv4 address of interface name, or nil.
func ifaceIP(name string) net.IP {
	i, err := net.InterfaceByName(name)
	if err != nil {
		return nil
	}
	addrs, err := i.Addrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.To4()
		}
	}
	return nil
}
