package ringapp

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

// Defaults of the flags. With them 4 ranks on one 2-core host (loopback) run for about 16 s.
const (
	DefaultMessages = 1000000
	DefaultWindow   = 64
	DefaultPayload  = 4 << 10
	DefaultPort     = 7171
)

// Exit codes of Main besides 0 and 128+signal.
const (
	exitError = 1 // setting up the ring, I/O
	exitUsage = 2 // bad flags or environment
	exitCheck = 3 // a message was corrupt, lost or duplicated
)

// Main runs one rank with args (without the program name) and returns its
// exit code: 0 once the run completed, 2 for bad flags, 3 if a message was
// corrupt, lost or duplicated, 128+n on signal n (SIGTERM, SIGINT), 1 for
// other errors.
func Main(args []string) int {
	cfg, err := parseArgs(args, os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ringapp:", err)
		return exitUsage
	}
	cfg.Stdout = os.Stdout

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			cancel(signalError{s.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()
	if cfg.Hold > 0 {
		cfg.Release = releaseOn(ctx, syscall.SIGUSR1)
	}

	_, err = Run(ctx, cfg)
	if err == nil {
		return 0
	}
	fmt.Printf("FAIL %v\n", err) // err names the rank
	var se signalError
	switch {
	case errors.As(err, &se):
		return 128 + int(se.sig)
	case errors.Is(err, ErrCorrupt), errors.Is(err, ErrLost), errors.Is(err, ErrDuplicate):
		return exitCheck
	}
	return exitError
}

// releaseOn returns a channel closed when the process receives sig.
func releaseOn(ctx context.Context, sig os.Signal) <-chan struct{} {
	c := make(chan os.Signal, 1)
	signal.Notify(c, sig)
	release := make(chan struct{})
	go func() {
		defer signal.Stop(c)
		select {
		case <-c:
			close(release)
		case <-ctx.Done():
		}
	}()
	return release
}

// signalError ends a run stopped by a signal.
type signalError struct{ sig syscall.Signal }

func (e signalError) Error() string { return "stopped by " + unix.SignalName(e.sig) }

// parseArgs turns flags and the environment cairn sets for every rank into
// a Config. Flags take precedence.
func parseArgs(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("ringapp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rank := fs.Int("rank", 0, "this rank, 0..size-1 (default $CAIRN_RANK)")
	size := fs.Int("size", 0, "number of ranks (default $CAIRN_SIZE, else the number of peers)")
	peers := fs.String("peers", "", "comma-separated addresses of all ranks in rank order (default $CAIRN_PEERS, else 127.0.0.1 for each)")
	job := fs.String("job", "", "job name, checked between neighbours (default $CAIRN_JOB)")
	port := fs.Int("port", DefaultPort, "port every rank listens on")
	portBase := fs.Int("port-base", 0, "if peers repeat an address, rank r listens on port-base+r instead (default -port)")
	messages := fs.Int("messages", DefaultMessages, "messages each rank handles")
	window := fs.Int("window", DefaultWindow, "messages rank 0 keeps in flight")
	payload := fs.Int("payload", DefaultPayload, "payload bytes per message")
	seed := fs.Uint64("seed", 1, "seed of the values rank 0 starts with")
	compute := fs.Int("compute", 0, "rounds of a deterministic busy loop per message and rank (about 4 ns each)")
	out := fs.String("out", "", "rank 0 writes the result to this file (atomically)")
	connectTimeout := fs.Duration("connect-timeout", time.Minute, "time to set up the ring (the only timeout)")
	progress := fs.Duration("progress", time.Second, "how often to print progress (0: never)")
	ballast := fs.Int("ballast", 0, "MiB of random memory each rank holds, and checks unchanged at the end (for images of a given size)")
	churn := fs.Int("churn", 0, "with -ballast: write a page of the ballast every N messages, round the ballast (checked at the end too)")
	hold := fs.Int("hold", 0, "rank 0 stops after this many messages came back until the process gets SIGUSR1 (for tests that must act on a running ring)")
	report := fs.Bool("report", true, "rank 0 publishes its progress as rank events through the rank API's socket ($CAIRN_SOCKET, or in a job of cairn's its usual path)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	if !set["job"] {
		*job = getenv("CAIRN_JOB")
	}
	if !set["peers"] {
		*peers = getenv("CAIRN_PEERS")
	}
	var hosts []string
	if *peers != "" {
		hosts = strings.Split(*peers, ",")
		for i, h := range hosts {
			hosts[i] = strings.TrimSpace(h)
			if hosts[i] == "" {
				return Config{}, fmt.Errorf("peers %q: empty address", *peers)
			}
		}
	}
	for _, v := range []struct {
		flag, env string
		p         *int
	}{{"rank", "CAIRN_RANK", rank}, {"size", "CAIRN_SIZE", size}} {
		if set[v.flag] {
			continue
		}
		s := getenv(v.env)
		if s == "" {
			if v.flag == "rank" {
				return Config{}, errors.New("no rank: set -rank or $CAIRN_RANK")
			}
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return Config{}, fmt.Errorf("$%s: %w", v.env, err)
		}
		*v.p = n
	}
	switch {
	case *size == 0 && hosts == nil:
		return Config{}, errors.New("no size: set -size, -peers, $CAIRN_SIZE or $CAIRN_PEERS")
	case *size == 0:
		*size = len(hosts)
	case hosts == nil && getenv("CAIRN_SUBNET") != "":
		// A job too large to be given $CAIRN_PEERS: rank r is the job
		// subnet's third address plus r.
		subnet, err := netip.ParsePrefix(getenv("CAIRN_SUBNET"))
		if err != nil {
			return Config{}, fmt.Errorf("$CAIRN_SUBNET: %w", err)
		}
		a := subnet.Masked().Addr().Next()
		for range *size {
			a = a.Next()
			hosts = append(hosts, a.String())
		}
	case hosts == nil:
		for range *size {
			hosts = append(hosts, "127.0.0.1")
		}
	case len(hosts) != *size:
		return Config{}, fmt.Errorf("%d peers for %d ranks", len(hosts), *size)
	}
	if *portBase == 0 {
		*portBase = *port
	}
	cfg := Config{
		Job: *job, Rank: *rank, Size: *size, Addrs: addrs(hosts, *port, *portBase),
		Messages: *messages, Window: *window, Payload: *payload, Seed: *seed, Compute: *compute,
		Out: *out, ConnectTimeout: *connectTimeout, Progress: *progress, BallastMiB: *ballast, Churn: *churn,
		Hold: *hold,
	}
	if *report && *rank == 0 {
		cfg.Socket = getenv(rankv1.EnvSocket)
		if cfg.Socket == "" && getenv("CAIRN_JOB") != "" {
			cfg.Socket = rankv1.SocketPath // a rank of a cairn job
		}
	}
	return cfg, cfg.check()
}

// addrs returns the address every rank listens on: port, or port base+r for
// rank r if some hosts repeat (ranks sharing an address).
func addrs(hosts []string, port, base int) []string {
	seen := map[string]bool{}
	repeat := false
	for _, h := range hosts {
		repeat = repeat || seen[h]
		seen[h] = true
	}
	a := make([]string, len(hosts))
	for r, h := range hosts {
		p := port
		if repeat {
			p = base + r
		}
		a[r] = net.JoinHostPort(h, strconv.Itoa(p))
	}
	return a
}
