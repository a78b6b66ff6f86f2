package launch

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Environment of an MPI job's ranks, besides CAIRN_JOB, CAIRN_RANK,
// CAIRN_SIZE, CAIRN_PEERS and CAIRN_IP, which every rank has.
const (
	EnvSecret = "CAIRN_LAUNCH_SECRET" // the job's secret, hex
	EnvSubnet = "CAIRN_SUBNET"        // the job network, CIDR
	EnvMPI    = "CAIRN_MPI"           // the MPI implementation
	EnvPort   = "CAIRN_LAUNCH_PORT"   // the daemons' port, if not Port
	EnvTools  = "CAIRN_TOOLS"         // where the cairn binary is in the rank
)

// Port is the launch daemons' TCP port on the job network.
const Port = 7470

// Timing of a daemon; variables so tests can shorten them.
var (
	// peersTimeout bounds rank 0's wait for every other daemon to answer.
	peersTimeout = 2 * time.Minute
	// idleExit: a daemon other than rank 0's exits this long after its
	// last command ended with no new one: rank 0 is gone without saying.
	idleExit = 5 * time.Second
	// startTimeout: a daemon other than rank 0's exits if no command came
	// this long after it started: rank 0 never launched.
	startTimeout = 10 * time.Minute
	// killGrace: a command whose client went away gets SIGTERM, then
	// SIGKILL after this.
	killGrace = 5 * time.Second
)

// Config is what a launch daemon needs.
type Config struct {
	Job     string
	Rank    int
	Peers   []netip.Addr // every rank's address, in rank order
	Subnet  netip.Prefix // the job network
	Secret  []byte
	Port    int
	MPI     string   // OpenMPI or MPICH
	Program []string // what the launcher starts, one per rank
	Tools   string   // where the cairn binary is in the rank ($CAIRN_TOOLS)
	Hosts   string   // the hosts file to write; "" writes none
	Log     io.Writer
}

// ConfigFromEnv reads a rank's launch daemon configuration from the
// environment cairn gives an MPI job's ranks.
func ConfigFromEnv(mpi string, program []string) (Config, error) {
	cfg := Config{Job: os.Getenv("CAIRN_JOB"), MPI: mpi, Program: program, Tools: os.Getenv(EnvTools), Hosts: "/etc/hosts", Log: os.Stderr, Port: Port}
	if err := CheckKind(mpi); err != nil {
		return cfg, err
	}
	if len(program) == 0 {
		return cfg, errors.New("no program to launch")
	}
	if cfg.Tools == "" {
		return cfg, fmt.Errorf("$%s is not set: the rank has no cairn tools mounted", EnvTools)
	}
	var err error
	if cfg.Rank, err = strconv.Atoi(os.Getenv("CAIRN_RANK")); err != nil {
		return cfg, fmt.Errorf("$CAIRN_RANK: %w", err)
	}
	if cfg.Peers, err = Peers(os.Getenv); err != nil {
		return cfg, err
	}
	if cfg.Rank < 0 || cfg.Rank >= len(cfg.Peers) {
		return cfg, fmt.Errorf("rank %d of %d peers", cfg.Rank, len(cfg.Peers))
	}
	if cfg.Subnet, err = netip.ParsePrefix(os.Getenv(EnvSubnet)); err != nil {
		return cfg, fmt.Errorf("$%s: %w", EnvSubnet, err)
	}
	if cfg.Secret, err = hex.DecodeString(os.Getenv(EnvSecret)); err != nil || len(cfg.Secret) < 16 {
		return cfg, fmt.Errorf("$%s: want at least 16 bytes of hex", EnvSecret)
	}
	if p := os.Getenv(EnvPort); p != "" {
		if cfg.Port, err = strconv.Atoi(p); err != nil || cfg.Port <= 0 || cfg.Port > 65535 {
			return cfg, fmt.Errorf("$%s: %q is not a port", EnvPort, p)
		}
	}
	return cfg, nil
}

// daemon is a running launch daemon.
type daemon struct {
	cfg    Config
	reaper *reaper
	quit   chan int

	mu       sync.Mutex
	sessions map[int]bool // process groups of running commands
	served   int
	idleAt   time.Time
	lastCode int
}

func (d *daemon) logf(format string, a ...any) {
	fmt.Fprintf(d.cfg.Log, "cairn-rankinit[%d]: %s\n", d.cfg.Rank, fmt.Sprintf(format, a...))
}

// Run is a rank's init: it serves the job's peers and, in rank 0, runs the
// launcher. It returns the process's exit code: rank 0's is the
// launcher's.
func Run(cfg Config) int {
	d := &daemon{cfg: cfg, quit: make(chan int, 1), sessions: map[int]bool{}, idleAt: time.Now()}
	d.reaper = newReaper()
	if cfg.Hosts != "" {
		if err := writeHosts(cfg); err != nil {
			d.logf("write %s: %v", cfg.Hosts, err)
			return 1
		}
	}
	self := cfg.Peers[cfg.Rank]
	var lc net.ListenConfig
	lc.SetMultipathTCP(false) // CRIU cannot dump MPTCP sockets
	ln, err := lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(self, uint16(cfg.Port)).String())
	if err != nil {
		d.logf("listen: %v", err)
		return 1
	}
	go d.serve(ln)
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if cfg.Rank != 0 {
		return d.follow(sigs)
	}
	return d.lead(sigs)
}

// follow is the life of a daemon other than rank 0's.
func (d *daemon) follow(sigs <-chan os.Signal) int {
	start := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case c := <-d.quit:
			d.killAll(syscall.SIGTERM)
			if c != 0 {
				d.logf("the launcher ended with %d", c)
			}
			return 0
		case sig := <-sigs:
			d.logf("%v: ending the job's commands", sig)
			d.killAll(sig.(syscall.Signal))
			return 128 + int(sig.(syscall.Signal))
		case <-tick.C:
		}
		d.mu.Lock()
		served, running, idle, last := d.served, len(d.sessions), time.Since(d.idleAt), d.lastCode
		d.mu.Unlock()
		switch {
		case served > 0 && running == 0 && idle > idleExit:
			d.logf("no command from rank 0 for %v after the last ended (%d): exiting", idleExit, last)
			if last != 0 {
				return 1
			}
			return 0
		case served == 0 && time.Since(start) > startTimeout:
			d.logf("rank 0 started nothing here within %v: exiting", startTimeout)
			return 1
		}
	}
}

// lead is rank 0's: wait for every peer's daemon, run the launcher, then
// tell the peers to end.
func (d *daemon) lead(sigs <-chan os.Signal) int {
	cfg := d.cfg
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/bin:/usr/bin:/bin"
	}
	if _, err := lookPath(cfg.Program[0], path); err != nil {
		d.logf("cannot run the job's program: %v", err)
		d.quitPeers(127)
		return 127
	}
	start := time.Now()
	for _, p := range cfg.Peers[1:] {
		for {
			err := d.ping(p, framePing, nil)
			if err == nil {
				break
			}
			if time.Since(start) > peersTimeout {
				d.logf("rank %s's launch daemon does not answer: %v", p, err)
				return 1
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	iface, err := ifaceOf(cfg.Peers[0])
	if err != nil {
		d.logf("%v", err)
		return 1
	}
	argv, env := launcher(cfg.MPI, cfg.Peers, cfg.Subnet, iface, cfg.Tools, cfg.Program)
	d.logf("%d ranks answered in %v; starting %s", len(cfg.Peers), time.Since(start).Round(time.Millisecond), argv[0])
	pid, done, err := d.reaper.spawn(argv, append(os.Environ(), env...), cwd(), []uintptr{0, 1, 2})
	if err != nil {
		d.logf("start %s: %v", argv[0], err)
		d.quitPeers(127)
		return 127
	}
	var code int
	for waiting := true; waiting; {
		select {
		case ws := <-done:
			code, waiting = exitCode(ws), false
		case sig := <-sigs:
			_ = syscall.Kill(-pid, sig.(syscall.Signal))
		}
	}
	d.quitPeers(code)
	return code
}

// quitPeers tells every other rank's daemon the job has ended.
func (d *daemon) quitPeers(code int) {
	for _, p := range d.cfg.Peers[1:] {
		if err := d.ping(p, frameQuit, code32(code)); err != nil {
			d.logf("tell rank %s the job ended: %v", p, err)
		}
	}
}

// ping sends a ping or a quit to a peer's daemon and waits for its answer.
func (d *daemon) ping(peer netip.Addr, t byte, p []byte) error {
	c, err := dial(netip.AddrPortFrom(peer, uint16(d.cfg.Port)).String(), d.cfg.Secret, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.c.Close()
	_ = c.c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.send(t, p); err != nil {
		return err
	}
	if t, _, err := c.recv(); err != nil || t != frameExit {
		return fmt.Errorf("no answer (%v): authentication refused?", err)
	}
	return nil
}

func (d *daemon) killAll(sig syscall.Signal) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for pg := range d.sessions {
		_ = syscall.Kill(-pg, sig)
	}
}

// serve accepts the job's peers until the listener fails.
func (d *daemon) serve(ln net.Listener) {
	for {
		nc, err := ln.Accept()
		if err != nil {
			d.logf("accept: %v", err)
			return
		}
		go d.handle(nc)
	}
}

// handle runs one connection: authentication, then a ping, a quit or a
// command.
func (d *daemon) handle(nc net.Conn) {
	defer nc.Close()
	from, err := netip.ParseAddrPort(nc.RemoteAddr().String())
	if err != nil || !slices.Contains(d.cfg.Peers, from.Addr().Unmap()) {
		d.logf("refused %s: not a rank of job %s", nc.RemoteAddr(), d.cfg.Job)
		return
	}
	c := newConn(nc)
	if err := challenge(c, d.cfg.Secret); err != nil {
		d.logf("refused %s: %v", nc.RemoteAddr(), err)
		return
	}
	t, p, err := c.recv()
	if err != nil {
		return
	}
	switch t {
	case framePing:
		_ = c.send(frameExit, code32(0))
	case frameQuit:
		_ = c.send(frameExit, code32(0))
		select {
		case d.quit <- codeOf(p):
		default:
		}
	case frameCommand:
		d.run(c, string(p))
	}
}

// run runs a command for a client, as an rsh server would: /bin/sh -c CMD
// in a process group of its own, its stdio relayed, its exit status last.
func (d *daemon) run(c *conn, cmd string) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return
	}
	pid, done, err := d.reaper.spawn([]string{"/bin/sh", "-c", cmd}, os.Environ(), "/", []uintptr{inR.Fd(), outW.Fd(), errW.Fd()})
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		_ = c.send(frameStderr, []byte(fmt.Sprintf("cairn-rankinit: %v\n", err)))
		_ = c.send(frameExit, code32(127))
		inW.Close()
		outR.Close()
		errR.Close()
		return
	}
	d.mu.Lock()
	d.sessions[pid] = true
	d.served++
	d.mu.Unlock()
	var relays sync.WaitGroup
	relay := func(r *os.File, t byte) {
		defer relays.Done()
		defer r.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				_ = c.send(t, buf[:n])
			}
			if err != nil {
				return
			}
		}
	}
	relays.Add(2)
	go relay(outR, frameStdout)
	go relay(errR, frameStderr)
	lost := make(chan struct{})
	go func() { // from the client: stdin and signals
		defer close(lost)
		for {
			t, p, err := c.recv()
			if err != nil {
				return
			}
			switch t {
			case frameStdin:
				_, _ = inW.Write(p)
			case frameStdinEOF:
				inW.Close()
			case frameSignal:
				if len(p) == 1 {
					_ = syscall.Kill(-pid, syscall.Signal(p[0]))
				}
			}
		}
	}()
	var ws syscall.WaitStatus
	select {
	case ws = <-done:
	case <-lost:
		// The client went away, as a dropped ssh session would: end the
		// command.
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		select {
		case ws = <-done:
		case <-time.After(killGrace):
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			ws = <-done
		}
	}
	relays.Wait()
	inW.Close()
	d.mu.Lock()
	delete(d.sessions, pid)
	d.lastCode = exitCode(ws)
	d.idleAt = time.Now()
	d.mu.Unlock()
	_ = c.send(frameExit, code32(exitCode(ws)))
}

// writeHosts writes the rank's hosts file: DNS is not to be relied on in a
// rank (lookups of unknown names time out), and launchers resolve their
// own host name.
func writeHosts(cfg Config) error {
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	for i, p := range cfg.Peers {
		fmt.Fprintf(&b, "%s\t%s-%d\n", p, cfg.Job, i)
	}
	return os.WriteFile(cfg.Hosts, []byte(b.String()), 0o644)
}

// ifaceOf names the interface that holds addr.
func ifaceOf(addr netip.Addr) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr() == addr {
				return ifc.Name, nil
			}
		}
	}
	return "", fmt.Errorf("no interface holds %s", addr)
}

func cwd() string {
	if d, err := os.Getwd(); err == nil {
		return d
	}
	return "/"
}

// Peers returns every rank's address, in rank order, from a rank's
// environment: $CAIRN_PEERS, or, for a job too large to be given that list
// (coord.MaxPeersEnv), from $CAIRN_SUBNET and $CAIRN_SIZE: rank r's
// address is the subnet's third plus r (its first two are the network's
// and a host's kept free).
func Peers(getenv func(string) string) ([]netip.Addr, error) {
	var out []netip.Addr
	if list := getenv("CAIRN_PEERS"); list != "" {
		for _, s := range strings.Split(list, ",") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("$CAIRN_PEERS: %w", err)
			}
			out = append(out, a)
		}
		return out, nil
	}
	subnet, err := netip.ParsePrefix(getenv(EnvSubnet))
	if err != nil {
		return nil, fmt.Errorf("no $CAIRN_PEERS, and $%s: %w", EnvSubnet, err)
	}
	size, err := strconv.Atoi(getenv("CAIRN_SIZE"))
	if err != nil || size < 1 {
		return nil, fmt.Errorf("no $CAIRN_PEERS, and $CAIRN_SIZE %q is not a job size", getenv("CAIRN_SIZE"))
	}
	a := subnet.Masked().Addr().Next()
	for range size {
		a = a.Next()
		if !subnet.Contains(a.Next()) { // a is past the subnet, or its broadcast address
			return nil, fmt.Errorf("%d ranks do not fit in %s", size, subnet)
		}
		out = append(out, a)
	}
	return out, nil
}
