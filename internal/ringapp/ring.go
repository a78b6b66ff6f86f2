package ringapp

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Config is one rank's part of a run.
type Config struct {
	Job      string   // job name; neighbours check that they agree on it
	Rank     int      // this rank, 0..Size-1
	Size     int      // number of ranks
	Addrs    []string // host:port every rank listens on, in rank order
	Messages int      // messages each rank handles
	Window   int      // messages rank 0 keeps in flight
	Payload  int      // payload bytes per message
	Seed     uint64   // seed of the values rank 0 starts with
	Compute  int      // rounds of the busy loop per message (about 4 ns each)
	Out      string   // if set, rank 0 writes the result to this file
	// ConnectTimeout bounds setting up the ring. Nothing else has a timeout.
	ConnectTimeout time.Duration
	// Progress is how often a rank prints its progress; 0 means never.
	Progress time.Duration
	// BallastMiB is how much random memory the rank holds through the
	// run (a checkpoint image of a given size); the run fails with
	// ErrCorrupt if it is not the same at the end.
	BallastMiB int
	// Churn, if above 0, has the rank write a page of its ballast every
	// Churn messages, round the ballast, so that its memory changes as it
	// runs; the end checks every page's writes as well.
	Churn int
	// Hold, if above 0 (rank 0 only), has rank 0 stop after Hold
	// messages came back, until Release is closed: a test acts on a ring
	// that cannot have ended yet, however slow the machine, and then lets
	// it finish. The messages in flight wait in the links meanwhile. A
	// nil Release holds until ctx ends.
	Hold    int
	Release <-chan struct{}
	// Listener, if set, is the listener of this rank (Run closes it);
	// otherwise Run listens on Addrs[Rank].
	Listener net.Listener
	// Stdout receives the progress lines and rank 0's result (nil: none).
	Stdout io.Writer
	// Socket, if set, is the rank API's socket (docs/rank-api.md): the
	// rank also publishes its progress there, every Progress, as events
	// of kind progress.
	Socket string
}

func (c *Config) check() error {
	switch {
	case c.Size < 1:
		return fmt.Errorf("size %d: need at least one rank", c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("rank %d: want 0..%d", c.Rank, c.Size-1)
	case len(c.Addrs) != c.Size:
		return fmt.Errorf("%d addresses for %d ranks", len(c.Addrs), c.Size)
	case c.Messages < 1:
		return fmt.Errorf("messages %d: want at least 1", c.Messages)
	case c.Window < 1 || c.Window > 1<<20:
		return fmt.Errorf("window %d: want 1..%d", c.Window, 1<<20)
	case c.Payload < 0 || c.Payload > maxPayload:
		return fmt.Errorf("payload %d: want 0..%d", c.Payload, maxPayload)
	case c.Compute < 0:
		return fmt.Errorf("compute %d: want at least 0", c.Compute)
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("connect timeout %v: want more than 0", c.ConnectTimeout)
	case c.BallastMiB < 0 || c.BallastMiB > 1<<16:
		return fmt.Errorf("ballast %d MiB: want 0..%d", c.BallastMiB, 1<<16)
	case c.Churn < 0 || c.Churn > 0 && c.BallastMiB == 0:
		return fmt.Errorf("churn %d: want 0, or more with a ballast", c.Churn)
	case c.Hold < 0 || c.Hold >= c.Messages:
		return fmt.Errorf("hold %d: want 0, or 1..%d", c.Hold, c.Messages-1)
	}
	return nil
}

// bufSize is the size of the buffered reader and writer of each link.
const bufSize = 256 << 10

// Run runs one rank until it has handled every message and its neighbours
// have confirmed the end of the run, or until ctx is done. It returns the
// result (rank 0) or "" (other ranks). Rank 0 also prints "result=<hex>"
// and writes "<hex>\n" to cfg.Out if set.
//
// After the ring is connected nothing depends on the wall clock, so a rank
// can be frozen, checkpointed and restored at any point.
func Run(ctx context.Context, cfg Config) (string, error) {
	if err := cfg.check(); err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return "", err
	}
	out := cfg.Stdout
	if out == nil {
		out = io.Discard
	}
	ballast := newBallast(cfg.BallastMiB, cfg.Seed, cfg.Rank, cfg.Churn)
	up, down, err := connect(ctx, &cfg, out)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Closing both links unblocks every read and write of this rank.
	stop := context.AfterFunc(ctx, func() {
		up.Close()
		down.Close()
	})
	defer stop()
	defer up.Close()
	defer down.Close()
	fmt.Fprintf(out, "rank %d/%d: ring connected (upstream %s, downstream %s)\n", cfg.Rank, cfg.Size, up.RemoteAddr(), down.RemoteAddr())

	r := &rank{cfg: &cfg, up: up, down: down, ballast: ballast,
		recv: newReceiver(bufio.NewReaderSize(up, bufSize), (cfg.Rank+cfg.Size-1)%cfg.Size, cfg.Payload),
		w:    bufio.NewWriterSize(down, bufSize),
	}
	r.progress.start(&cfg, out)
	if cfg.Socket != "" && cfg.Progress > 0 {
		r.progress.reporter = newReporter(cfg.Socket)
		defer r.progress.reporter.close()
	}
	var result uint64
	if cfg.Rank == 0 {
		result, err = r.lead(ctx, cancel)
	} else {
		err = r.forward()
	}
	if err == nil {
		err = r.finish()
	}
	if err == nil {
		err = ballast.check(cfg.Messages)
	}
	if err != nil {
		cancel(err)
		return "", fmt.Errorf("rank %d: %w", cfg.Rank, context.Cause(ctx))
	}
	fmt.Fprintf(out, "rank %d: done %d msgs\n", cfg.Rank, cfg.Messages)
	if cfg.Rank != 0 {
		return "", nil
	}
	res := formatResult(result)
	if cfg.Out != "" {
		if err := writeFileAtomic(cfg.Out, []byte(res+"\n")); err != nil {
			return "", fmt.Errorf("rank 0: write result: %w", err)
		}
	}
	fmt.Fprintf(out, "result=%s\n", res)
	return res, nil
}

// ballast is a rank's random memory (Config.BallastMiB). With churn, the
// rank writes one of its pages every churn messages, in page order round
// the ballast: the page's first 8 bytes are XORed with how often it was
// written, which it keeps in writes (memory too).
type ballast struct {
	b      []byte
	sum    [sha256.Size]byte // of b as made
	churn  int
	writes []uint64 // by page
}

// newBallast returns mib MiB of pseudo-random bytes (by seed and rank).
func newBallast(mib int, seed uint64, rank, churn int) *ballast {
	b := make([]byte, mib<<20)
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(rank), byte(rank >> 8)})
	rng.Read(b)
	bl := &ballast{b: b, sum: sha256.Sum256(b), churn: churn}
	if churn > 0 {
		bl.writes = make([]uint64, len(b)/ballastPage)
	}
	return bl
}

const ballastPage = 4096

// touch writes a page once n messages are done, every churn messages.
func (bl *ballast) touch(n int) {
	if bl.churn <= 0 || n%bl.churn != 0 {
		return
	}
	p := (n/bl.churn - 1) % len(bl.writes)
	bl.writes[p]++
	w := bl.writes[p]
	head := bl.b[p*ballastPage:]
	binary.LittleEndian.PutUint64(head, binary.LittleEndian.Uint64(head)^(w-1)^w)
}

// check checks the ballast after messages messages: every page written as
// often as the messages say, and, those writes undone, every byte as made.
func (bl *ballast) check(messages int) error {
	if bl.churn > 0 {
		k, pages := messages/bl.churn, len(bl.writes)
		for p, w := range bl.writes {
			want := uint64(k / pages)
			if p < k%pages {
				want++
			}
			if w != want {
				return fmt.Errorf("%w: page %d of the rank's ballast was written %d times, want %d", ErrCorrupt, p, w, want)
			}
			head := bl.b[p*ballastPage:]
			binary.LittleEndian.PutUint64(head, binary.LittleEndian.Uint64(head)^w)
		}
	}
	if sha256.Sum256(bl.b) != bl.sum {
		return fmt.Errorf("%w: the rank's %d MiB of ballast memory changed", ErrCorrupt, len(bl.b)>>20)
	}
	return nil
}

// rank is one rank of a running ring.
type rank struct {
	cfg      *Config
	up, down net.Conn
	recv     *receiver     // messages from upstream
	w        *bufio.Writer // messages to downstream
	progress progress
	ballast  *ballast
	sink     uint64 // results of burn, kept so the loop is not optimised away
}

// forward is the loop of ranks other than 0: receive message j, mix the
// rank into its value and send it on.
func (r *rank) forward() error {
	buf := make([]byte, messageSize(r.cfg.Payload))
	for j := range r.cfg.Messages {
		v, err := r.recv.receive()
		if err != nil {
			return err
		}
		seq := uint64(j)
		v = mix(v, r.cfg.Rank, seq)
		if r.cfg.Compute > 0 {
			r.sink += burn(v, r.cfg.Compute)
		}
		encode(buf, seq, v, r.cfg.Rank)
		if _, err := r.w.Write(buf); err != nil {
			return fmt.Errorf("send message %d to rank %d: %w", j, (r.cfg.Rank+1)%r.cfg.Size, err)
		}
		// Flush before a read that may block, never later.
		if r.recv.r.Buffered() < len(buf) {
			if err := r.w.Flush(); err != nil {
				return fmt.Errorf("send message %d to rank %d: %w", j, (r.cfg.Rank+1)%r.cfg.Size, err)
			}
		}
		r.progress.tick(j + 1)
		r.ballast.touch(j + 1)
	}
	if err := r.w.Flush(); err != nil {
		return fmt.Errorf("send the last messages to rank %d: %w", (r.cfg.Rank+1)%r.cfg.Size, err)
	}
	return nil
}

// lead is the loop of rank 0. A writer goroutine sends messages as values
// for them become known: the first window from the seed, then message
// j+window once message j is back. This goroutine only receives, so the
// ring never stalls with every rank blocked in a write, whatever the window
// and payload.
func (r *rank) lead(ctx context.Context, cancel context.CancelCauseFunc) (uint64, error) {
	cfg := r.cfg
	inflight := min(cfg.Window, cfg.Messages)
	// Never holds more than inflight values: one is added only when a
	// message came back, i.e. when one fewer is in flight.
	values := make(chan uint64, inflight)
	for s := range inflight {
		values <- mix(cfg.Seed, 0, uint64(s))
	}
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		if err := r.send(ctx, values); err != nil {
			cancel(err)
		}
	}()
	result := initResult(cfg.Size, cfg.Messages, cfg.Window, cfg.Seed)
	for j := range cfg.Messages {
		v, err := r.recv.receive()
		if err != nil {
			cancel(err) // stop the writer
			<-sent
			return 0, err
		}
		seq := uint64(j)
		if cfg.Compute > 0 {
			r.sink += burn(v, cfg.Compute)
		}
		result = fold(result, seq, v)
		if next := j + cfg.Window; next < cfg.Messages {
			values <- mix(v, 0, uint64(next))
		}
		r.progress.tick(j + 1)
		r.ballast.touch(j + 1)
		if j+1 == cfg.Hold {
			if err := r.hold(ctx); err != nil {
				cancel(err)
				<-sent
				return 0, err
			}
		}
	}
	<-sent
	if ctx.Err() != nil {
		return 0, context.Cause(ctx)
	}
	return result, nil
}

// hold waits for cfg.Release once Hold messages came back.
func (r *rank) hold(ctx context.Context) error {
	fmt.Fprintf(r.progress.out, "rank 0: holding after %d msgs\n", r.cfg.Hold)
	select {
	case <-r.cfg.Release:
		fmt.Fprintf(r.progress.out, "rank 0: released\n")
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// send is rank 0's writer: message s carries the s-th value from values.
func (r *rank) send(ctx context.Context, values <-chan uint64) error {
	buf := make([]byte, messageSize(r.cfg.Payload))
	for s := range r.cfg.Messages {
		var v uint64
		select {
		case v = <-values:
		default:
			// Nothing to send right now: push out what is buffered first.
			if err := r.w.Flush(); err != nil {
				return fmt.Errorf("send message %d to rank %d: %w", s, 1%r.cfg.Size, err)
			}
			select {
			case v = <-values:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		encode(buf, uint64(s), v, 0)
		if _, err := r.w.Write(buf); err != nil {
			return fmt.Errorf("send message %d to rank %d: %w", s, 1%r.cfg.Size, err)
		}
	}
	if err := r.w.Flush(); err != nil {
		return fmt.Errorf("send the last messages to rank %d: %w", 1%r.cfg.Size, err)
	}
	return nil
}

// finish ends a run in which this rank has received and sent every message.
// Each link is closed only once both ends know that all messages went
// through, and the sockets stay established until then:
//
//  1. tell upstream "done, N received" (a few bytes nobody else writes on
//     that connection, so this does not block);
//  2. wait for the same from downstream, then close the downstream link;
//  3. wait for upstream to close (nothing else may come), then close.
//
// Step 2 waits only for downstream's step 1, and step 3 only for upstream's
// step 2, so no cycle of waits can form around the ring.
func (r *rank) finish() error {
	cfg := r.cfg
	next, prev := (cfg.Rank+1)%cfg.Size, (cfg.Rank+cfg.Size-1)%cfg.Size
	if _, err := r.up.Write(marshalDone(cfg.Messages)); err != nil {
		return fmt.Errorf("tell rank %d all messages arrived: %w", prev, err)
	}
	b := make([]byte, doneSize)
	if _, err := io.ReadFull(r.down, b); err != nil {
		return fmt.Errorf("wait for rank %d to confirm the last message: %w", next, err)
	}
	if string(b[:8]) != doneMagic {
		return fmt.Errorf("rank %d sent %q instead of its confirmation", next, b)
	}
	if n := binary.LittleEndian.Uint64(b[8:]); n != uint64(cfg.Messages) {
		return fmt.Errorf("%w: rank %d confirmed %d of %d messages", ErrLost, next, n, cfg.Messages)
	}
	r.down.Close()
	if err := r.recv.expectEnd(); err != nil {
		return err
	}
	return r.up.Close()
}

// progress prints "rank R: N/M msgs" lines every cfg.Progress, and
// publishes the count if it has a reporter.
type progress struct {
	out      io.Writer
	rank     int
	total    int
	every    time.Duration
	last     time.Time
	reporter *reporter
}

func (p *progress) start(cfg *Config, out io.Writer) {
	*p = progress{out: out, rank: cfg.Rank, total: cfg.Messages, every: cfg.Progress, last: time.Now()}
}

func (p *progress) tick(n int) {
	if p.every <= 0 || n%16 != 0 {
		return
	}
	if now := time.Now(); now.Sub(p.last) >= p.every {
		p.last = now
		fmt.Fprintf(p.out, "rank %d: %d/%d msgs\n", p.rank, n, p.total)
		if p.reporter != nil {
			p.reporter.report(n)
		}
	}
}

// connect sets up this rank's links: it listens, dials its downstream
// (retrying, as ranks start in any order) and accepts its upstream, all
// within cfg.ConnectTimeout.
func connect(ctx context.Context, cfg *Config, out io.Writer) (up, down net.Conn, err error) {
	deadline := time.Now().Add(cfg.ConnectTimeout)
	ln := cfg.Listener
	if ln == nil {
		lc := net.ListenConfig{KeepAlive: -1}
		if ln, err = lc.Listen(ctx, "tcp", cfg.Addrs[cfg.Rank]); err != nil {
			return nil, nil, fmt.Errorf("rank %d: listen: %w", cfg.Rank, err)
		}
	}
	defer ln.Close()
	fmt.Fprintf(out, "rank %d/%d: listening on %s\n", cfg.Rank, cfg.Size, ln.Addr())

	dctx, dcancel := context.WithDeadline(ctx, deadline)
	defer dcancel()
	stop := context.AfterFunc(dctx, func() { ln.Close() })
	defer stop()
	type dialed struct {
		c   net.Conn
		err error
	}
	dc := make(chan dialed, 1)
	go func() {
		c, err := dial(dctx, cfg)
		dc <- dialed{c, err}
	}()
	up, err = accept(dctx, ln, cfg, out)
	if err != nil {
		timedOut := context.Cause(dctx) == context.DeadlineExceeded
		dcancel()
		d := <-dc
		if d.c != nil {
			d.c.Close()
		}
		if timedOut && d.err != nil {
			return nil, nil, fmt.Errorf("rank %d: %w; %w", cfg.Rank, err, d.err)
		}
		return nil, nil, fmt.Errorf("rank %d: %w", cfg.Rank, err)
	}
	d := <-dc
	if d.err != nil {
		up.Close()
		return nil, nil, fmt.Errorf("rank %d: %w", cfg.Rank, d.err)
	}
	return up, d.c, nil
}

// dial connects to the downstream rank and sends it a hello.
func dial(ctx context.Context, cfg *Config) (net.Conn, error) {
	next := (cfg.Rank + 1) % cfg.Size
	addr := cfg.Addrs[next]
	d := net.Dialer{KeepAlive: -1}
	retry := time.NewTicker(100 * time.Millisecond)
	defer retry.Stop()
	var last error // of the last attempt that the deadline did not cut short
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil && ctx.Err() == nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			last = err
		}
		if err == nil {
			if dl, ok := ctx.Deadline(); ok {
				c.SetWriteDeadline(dl)
			}
			if _, err = c.Write(newHello(cfg).marshal()); err == nil {
				c.SetWriteDeadline(time.Time{})
				return c, nil
			}
			last = err
			c.Close()
		}
		select {
		case <-ctx.Done():
			if context.Cause(ctx) == context.DeadlineExceeded {
				if last == nil {
					last = err
				}
				return nil, fmt.Errorf("connect to rank %d at %s within %v: %w", next, addr, cfg.ConnectTimeout, last)
			}
			return nil, context.Cause(ctx)
		case <-retry.C:
		}
	}
}

// accept waits for the upstream rank to connect and checks its hello.
// Connections that do not start with a hello are dropped; a hello from the
// wrong rank or another run is an error.
func accept(ctx context.Context, ln net.Listener, cfg *Config, out io.Writer) (net.Conn, error) {
	prev := (cfg.Rank + cfg.Size - 1) % cfg.Size
	want := newHello(cfg)
	want.rank = prev
	dl, _ := ctx.Deadline()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				if context.Cause(ctx) == context.DeadlineExceeded {
					return nil, fmt.Errorf("accept rank %d on %s: no connection within %v", prev, ln.Addr(), cfg.ConnectTimeout)
				}
				return nil, context.Cause(ctx)
			}
			return nil, fmt.Errorf("accept rank %d: %w", prev, err)
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetKeepAlive(false)
		}
		c.SetReadDeadline(dl)
		b := make([]byte, helloSize)
		_, err = io.ReadFull(c, b)
		var h hello
		if err == nil {
			h, err = unmarshalHello(b)
		}
		if err != nil {
			fmt.Fprintf(out, "rank %d: dropped a connection from %s: %v\n", cfg.Rank, c.RemoteAddr(), err)
			c.Close()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, fmt.Errorf("accept rank %d: no hello within %v", prev, cfg.ConnectTimeout)
			}
			continue
		}
		if h != want {
			c.Close()
			return nil, fmt.Errorf("connection from %s is %s, want %s (another job, or ranks started with different flags)", c.RemoteAddr(), h, want)
		}
		c.SetReadDeadline(time.Time{})
		return c, nil
	}
}

// writeFileAtomic replaces name with data: temporary file, fsync, rename,
// fsync of the directory.
func writeFileAtomic(name string, data []byte) error {
	dir := filepath.Dir(name)
	f, err := os.CreateTemp(dir, "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), name); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
