// The rank API: the unix socket in every rank's container through which
// the rank talks to cairn (docs/rank-api.md, api/rank/v1).

package agent

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
	"github.com/cairn-hpc/cairn/internal/failpoint"
)

// RankCoordinator is what the rank API asks of the coordinator, for a
// rank of a job this node holds: rpc.CoordClient with the node's
// credentials (the coordinator checks that the node holds the rank).
type RankCoordinator interface {
	RankCheckpoint(ctx context.Context, req coordv1.RankRequest) (coordv1.Ckpt, error)
	RankInfo(ctx context.Context, req coordv1.RankRequest) (coordv1.RankInfo, error)
	RankEvent(ctx context.Context, req coordv1.RankRequest) error
}

// rankSelf is what the node knows of the rank behind an endpoint.
type rankSelf struct {
	Job          string
	Rank, Size   int
	Mode         string
	RestoredFrom int // the checkpoint its processes were restored from; 0: started afresh
	Incarnation  int
}

// rankLookup says who the rank in container name is, as the node knows it
// now (the Manager: the container's environment and incarnations).
type rankLookup func(ctx context.Context, name string) (rankSelf, error)

// Limits of the rank API.
const (
	// maxPrepareWait is the most a rank is given to answer prepare,
	// whatever it asked for.
	maxPrepareWait = 30 * time.Second
	// requestTimeout bounds reading a request and writing its reply.
	requestTimeout = 10 * time.Second
	// keepResults is how long the outcome of a checkpoint a rank asked
	// for is kept for it to read.
	keepResults = 10 * time.Minute
)

// lineTimeout bounds the time a watcher takes to send a line once its
// first byte came: a rank may keep a watch open for as long as it runs,
// not a half-sent line in the agent's memory. A variable for tests.
var lineTimeout = requestTimeout

// endpoints are the rank API's sockets on this node, one a rank
// container, and the checkpoints ranks asked for.
type endpoints struct {
	dir    func(name string) string // the host dir bound at rankv1.SocketDir in the container
	self   rankLookup
	coord  func() RankCoordinator // nil while the node is in no cluster
	log    *slog.Logger
	mu     sync.Mutex
	byName map[string]*endpoint
	asked  map[string]*ticket
	// last is the newest checkpoint committed on this node for each rank
	// (it may not be durable in the catalog yet when the rank runs again).
	last map[string]int
}

func newEndpoints(dir func(string) string, self rankLookup, coord func() RankCoordinator, log *slog.Logger) *endpoints {
	return &endpoints{dir: dir, self: self, coord: coord, log: log, byName: map[string]*endpoint{}, asked: map[string]*ticket{}, last: map[string]int{}}
}

// endpoint is one rank container's socket: the listener (nil while the
// rank is quiesced for a dump), the connections open on it, and the ranks'
// watchers among them.
type endpoint struct {
	name string
	path string

	mu       sync.Mutex
	ln       *net.UnixListener
	conns    map[net.Conn]bool
	watchers map[*watcher]bool
	closed   bool // the container is gone: never listen again

	// replies answers a checkpoint or event sent again after its
	// connection closed (a quiesce) without carrying it out twice.
	replies rankv1.Replies

	// toCoord paces the rank's requests that reach the coordinator
	// (info, checkpoint, event): past its burst a request waits its turn,
	// so that no rank makes the coordinator work as fast as it can ask.
	toCoord *rate.Limiter
}

// Requests to the coordinator a rank may make: rankCoordRate a second,
// rankCoordBurst at once.
const (
	rankCoordRate  = 20
	rankCoordBurst = 40
)

// watcher is a connection of a rank that asked to be told before
// checkpoints.
type watcher struct {
	conn     net.Conn
	deadline time.Duration
	ready    chan struct{} // closed when the rank answers ready
	once     sync.Once
	gone     chan struct{} // closed when the rank hangs up (or sends anything else)
}

// ticket is a checkpoint a rank asked for.
type ticket struct {
	name        string // the container that asked
	incarnation int    // its incarnation then
	done        bool
	ckpt        int
	err         error
	at          time.Time
}

// open starts serving container name's socket (again). It replaces a
// socket file left behind.
func (e *endpoints) open(name string) error {
	e.mu.Lock()
	ep := e.byName[name]
	if ep == nil {
		ep = &endpoint{name: name, path: filepath.Join(e.dir(name), filepath.Base(rankv1.SocketPath)),
			conns: map[net.Conn]bool{}, watchers: map[*watcher]bool{}, toCoord: rate.NewLimiter(rankCoordRate, rankCoordBurst)}
		e.byName[name] = ep
	}
	e.mu.Unlock()
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.ln != nil || ep.closed {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(ep.path), 0o700); err != nil {
		return err
	}
	_ = os.Remove(ep.path)
	ln, err := listenUnix(ep.path)
	if err != nil {
		return fmt.Errorf("rank API of %s: %w", name, err)
	}
	ln.SetUnlinkOnClose(false) // quiesce removes the file first itself
	ep.ln = ln
	go e.accept(ep, ln)
	return nil
}

// quiesce closes container name's socket and every connection on it, so
// that nothing of the rank is connected outside its container when it is
// dumped: first the file goes (no new connection can start), then the
// ones waiting to be accepted and the open ones are closed. A rank that
// connects meanwhile finds no socket and tries again later.
func (e *endpoints) quiesce(name string) {
	ep := e.get(name)
	if ep == nil {
		return
	}
	ep.mu.Lock()
	ln := ep.ln
	ep.ln = nil
	conns := ep.conns
	ep.conns = map[net.Conn]bool{}
	ep.watchers = map[*watcher]bool{}
	ep.mu.Unlock()
	if ln == nil {
		return
	}
	_ = os.Remove(ep.path)
	// Closing the listener also releases the connections still in its
	// backlog (made, not yet accepted): the rank sees them reset, as it
	// sees the accepted ones closed, and none is left open for the dump
	// to find. Close returns once the socket is closed, even while
	// accept waits on it.
	ln.Close()
	for c := range conns {
		c.Close()
	}
}

// reopen serves container name's socket again after a dump, if it has
// one.
func (e *endpoints) reopen(name string) {
	if e.get(name) == nil {
		return
	}
	if err := e.open(name); err != nil {
		e.log.Warn("rank API: serve the socket again", "rank", name, "err", err)
	}
}

// close stops serving container name's socket for good (the container
// is removed, or moved away).
func (e *endpoints) close(name string) {
	e.quiesce(name)
	e.mu.Lock()
	ep := e.byName[name]
	delete(e.byName, name)
	delete(e.last, name)
	e.mu.Unlock()
	if ep != nil {
		ep.mu.Lock()
		ep.closed = true
		ep.mu.Unlock()
	}
}

// committed notes that checkpoint seq of container name is committed.
func (e *endpoints) committed(name string, seq int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.last[name] = max(e.last[name], seq)
}

// newest is the newest checkpoint of container name's job that the rank
// knows of: the catalog's newest durable one, or a newer one committed
// here.
func (e *endpoints) newest(name string, durable int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return max(durable, e.last[name])
}

func (e *endpoints) get(name string) *endpoint {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byName[name]
}

// prepare tells the watchers of container name that checkpoint ckpt is
// about to freeze the rank and waits for each to answer ready (at most its
// deadline); then it quiesces the socket. A watcher that does not answer
// in time fails the prepare. mustWatch (application-level mode) fails it
// too if no one watches: such a rank saves its state only when told.
func (e *endpoints) prepare(ctx context.Context, name string, ckpt int, mode string, mustWatch bool) error {
	ep := e.get(name)
	if ep == nil {
		if mustWatch {
			return fmt.Errorf("rank %s: no rank API to tell it to save its state", name)
		}
		return nil
	}
	ep.mu.Lock()
	var ws []*watcher
	for w := range ep.watchers {
		ws = append(ws, w)
	}
	ep.mu.Unlock()
	if len(ws) == 0 && mustWatch {
		e.quiesce(name)
		return fmt.Errorf("rank %s does not watch the rank API: an application-level checkpoint cannot tell it to save its state", name)
	}
	var errs []error
	for _, w := range ws {
		ev, _ := json.Marshal(rankv1.Event{Event: rankv1.EventPrepare, Ckpt: ckpt, Mode: mode, DeadlineMS: int(w.deadline / time.Millisecond)})
		_ = w.conn.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := w.conn.Write(append(ev, '\n')); err != nil {
			errs = append(errs, fmt.Errorf("rank %s: tell it checkpoint %d comes: %w", name, ckpt, err))
			continue
		}
		select {
		case <-w.ready:
		case <-w.gone:
			select {
			case <-w.ready: // it answered, then hung up
			default:
				errs = append(errs, fmt.Errorf("rank %s hung up its watch before it answered its checkpoint callback", name))
			}
		case <-time.After(w.deadline):
			errs = append(errs, fmt.Errorf("rank %s did not answer its checkpoint callback within %s", name, w.deadline))
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
		}
	}
	e.quiesce(name)
	return errors.Join(errs...)
}

// maxRankConns bounds the connections one rank holds open on its
// socket: a rank needs a watch and a request or two at a time, and each
// connection costs its agent a file descriptor and a goroutine.
const maxRankConns = 32

// accept serves the connections of ep's listener ln until it is closed
// (quiesce, close). A failed accept that is not the listener's end (no
// file descriptor left: EMFILE, ENFILE) is tried again after a pause, so
// that the socket, which stays in place, is never left unserved. A rank
// that holds maxRankConns connections gets its next ones refused with a
// reply that says so.
func (e *endpoints) accept(ep *endpoint, ln *net.UnixListener) {
	pause := 5 * time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			ep.mu.Lock()
			mine := ep.ln == ln
			ep.mu.Unlock()
			if !mine || errors.Is(err, net.ErrClosed) {
				return // closed by quiesce or close
			}
			e.log.Warn("rank API: accept failed; trying again", "rank", ep.name, "err", err, "in", pause)
			time.Sleep(pause)
			pause = min(2*pause, time.Second)
			continue
		}
		pause = 5 * time.Millisecond
		ep.mu.Lock()
		if ep.ln != ln {
			ep.mu.Unlock()
			c.Close()
			return
		}
		if len(ep.conns) >= maxRankConns {
			ep.mu.Unlock()
			go refuseConn(c, ep.name)
			continue
		}
		ep.conns[c] = true
		ep.mu.Unlock()
		go e.serve(ep, c)
	}
}

// lingering bounds the refused connections kept open a moment after
// their reply, so that the rank's request is read rather than its write
// failing: past it, a refused connection is closed at once.
var lingering = make(chan struct{}, 16)

// refuseConn tells a rank over its limit of connections why, and hangs up
// once it has sent its request (at most 100 ms later).
func refuseConn(c net.Conn, name string) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(100 * time.Millisecond))
	writeReply(c, rankFail(rankv1.CodeUnavailable, fmt.Sprintf("rank %s holds %d connections to its rank API, the most it may: close one and try again", name, maxRankConns)))
	select {
	case lingering <- struct{}{}:
		defer func() { <-lingering }()
		_, _ = bufio.NewReaderSize(c, 512).ReadSlice('\n')
	default:
	}
}

// serve answers one connection: one request, one reply; a watch stays
// open until the endpoint quiesces or the rank goes.
func (e *endpoints) serve(ep *endpoint, c net.Conn) {
	defer func() {
		ep.mu.Lock()
		delete(ep.conns, c)
		ep.mu.Unlock()
		c.Close()
	}()
	_ = c.SetDeadline(time.Now().Add(requestTimeout))
	r := bufio.NewReaderSize(c, 4096)
	req, err := readRequest(r)
	if err != nil {
		writeReply(c, rankFail(rankv1.CodeBadRequest, err.Error()))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	self, err := e.self(ctx, ep.name)
	if err != nil {
		writeReply(c, rankFail(rankv1.CodeUnavailable, err.Error()))
		return
	}
	if (req.Job != "" && req.Job != self.Job) || (req.Rank != nil && *req.Rank != self.Rank) {
		writeReply(c, rankFail(rankv1.CodeForbidden, fmt.Sprintf("rank %d of job %s may act on its own job only", self.Rank, self.Job)))
		return
	}
	if !rankv1.ValidID(req.ID) {
		writeReply(c, rankFail(rankv1.CodeBadRequest, fmt.Sprintf("a request id is 1 to %d letters, digits, '-' or '_'", rankv1.MaxID)))
		return
	}
	switch req.Op {
	case rankv1.OpInfo, rankv1.OpCheckpoint, rankv1.OpEvent:
		if err := ep.toCoord.Wait(ctx); err != nil {
			writeReply(c, rankFail(rankv1.CodeUnavailable, "too many requests from this rank: try again in a moment"))
			return
		}
	}
	switch req.Op {
	case rankv1.OpWatch:
		e.watch(ep, c, r, req, self)
	case rankv1.OpCheckpoint, rankv1.OpEvent:
		failpoint.Hold(ctx, "rank-request", e.log)
		reply, did := ep.replies.Do(ctx, req, func() rankv1.Reply { return e.answer(ctx, ep.name, req, self) })
		if !did {
			e.log.Info("rank API: a request sent again, answered with its first reply", "rank", ep.name, "op", req.Op, "id", req.ID)
		}
		failpoint.Hold(ctx, "rank-reply", e.log)
		writeReply(c, reply)
	default:
		writeReply(c, e.answer(ctx, ep.name, req, self))
	}
}

// answer carries out a request other than watch.
func (e *endpoints) answer(ctx context.Context, name string, req rankv1.Request, self rankSelf) rankv1.Reply {
	rank := coordv1.RankRequest{Job: self.Job, Rank: self.Rank}
	switch req.Op {
	case rankv1.OpInfo:
		out := selfReply(self)
		out.Restored = self.RestoredFrom > 0
		if co := e.coordinator(); co != nil {
			if info, err := co.RankInfo(ctx, rank); err == nil {
				out.Ckpt = e.newest(name, info.Ckpt)
			} else {
				return coordFail(err)
			}
		}
		return out
	case rankv1.OpCheckpoint:
		co := e.coordinator()
		if co == nil {
			return rankFail(rankv1.CodeUnavailable, "this node is in no cluster")
		}
		rank.Stop = req.Stop
		return e.ask(name, self, co, rank)
	case rankv1.OpResult:
		return e.result(req.Ticket, name, self)
	case rankv1.OpEvent:
		if !eventKind.MatchString(req.Kind) || len(req.Message) > rankv1.MaxMessage {
			return rankFail(rankv1.CodeBadRequest, fmt.Sprintf("an event has a kind of 1 to %d letters, digits, '.', '-' or '_', and a message of at most %d bytes", rankv1.MaxKind, rankv1.MaxMessage))
		}
		co := e.coordinator()
		if co == nil {
			return rankFail(rankv1.CodeUnavailable, "this node is in no cluster")
		}
		rank.Kind, rank.Message = req.Kind, req.Message
		if err := co.RankEvent(ctx, rank); err != nil {
			return coordFail(err)
		}
		return rankv1.Reply{OK: true}
	}
	return rankFail(rankv1.CodeBadRequest, fmt.Sprintf("no operation %q", req.Op))
}

var eventKind = regexp.MustCompile(`^[A-Za-z0-9._-]{1,32}$`)

func (e *endpoints) coordinator() RankCoordinator {
	if e.coord == nil {
		return nil
	}
	return e.coord()
}

// ask starts the checkpoint a rank asked for, in the background (the
// rank is frozen during it), and returns its ticket.
func (e *endpoints) ask(name string, self rankSelf, co RankCoordinator, req coordv1.RankRequest) rankv1.Reply {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	id := name + "-" + hex.EncodeToString(b)
	t := &ticket{name: name, incarnation: self.Incarnation, at: time.Now()}
	e.mu.Lock()
	for k, old := range e.asked {
		if time.Since(old.at) > keepResults {
			delete(e.asked, k)
		}
	}
	e.asked[id] = t
	e.mu.Unlock()
	go func() {
		ck, err := co.RankCheckpoint(context.Background(), req)
		e.mu.Lock()
		defer e.mu.Unlock()
		t.done, t.ckpt, t.err = true, ck.Seq, err
		if err != nil {
			e.log.Info("rank API: checkpoint asked by a rank", "job", req.Job, "rank", req.Rank, "err", err)
		}
	}()
	return rankv1.Reply{OK: true, Ticket: id, State: rankv1.StatePending}
}

// result answers a rank asking how its checkpoint went. A rank restored
// since it asked (on this node or another: the ticket is unknown there)
// is told so, with the checkpoint it runs from.
func (e *endpoints) result(id, name string, self rankSelf) rankv1.Reply {
	e.mu.Lock()
	t := e.asked[id]
	e.mu.Unlock()
	switch {
	case t != nil && t.name != name:
		return rankFail(rankv1.CodeForbidden, "not this rank's ticket")
	case t == nil || t.incarnation != self.Incarnation:
		if self.RestoredFrom > 0 {
			return rankv1.Reply{OK: true, State: rankv1.StateRestored, RestoredFrom: self.RestoredFrom}
		}
		return rankFail(rankv1.CodeNotFound, fmt.Sprintf("no ticket %q", id))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case !t.done:
		return rankv1.Reply{OK: true, State: rankv1.StatePending, Ticket: id}
	case t.err != nil:
		r := coordFail(t.err)
		r.State, r.Ticket = rankv1.StateFailed, id
		return r
	}
	return rankv1.Reply{OK: true, State: rankv1.StateDone, Ckpt: t.ckpt, Ticket: id}
}

// watch registers a rank's watcher: it is told before checkpoints until
// the endpoint quiesces (or the rank hangs up).
func (e *endpoints) watch(ep *endpoint, c net.Conn, r *bufio.Reader, req rankv1.Request, self rankSelf) {
	d := time.Duration(req.DeadlineMS) * time.Millisecond
	if d <= 0 || d > maxPrepareWait {
		d = maxPrepareWait
	}
	w := &watcher{conn: c, deadline: d, ready: make(chan struct{}), gone: make(chan struct{})}
	defer close(w.gone)
	out := selfReply(self)
	if co := e.coordinator(); co != nil {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		if info, err := co.RankInfo(ctx, coordv1.RankRequest{Job: self.Job, Rank: self.Rank}); err == nil {
			out.Ckpt = info.Ckpt
		}
		cancel()
	}
	out.Ckpt = e.newest(ep.name, out.Ckpt)
	ep.mu.Lock()
	if ep.conns[c] {
		ep.watchers[w] = true
	}
	ep.mu.Unlock()
	writeReply(c, out)
	// The only message a watcher sends is ready; anything else, the rank
	// hanging up, or a line not sent whole in lineTimeout ends the watch.
	for {
		_ = c.SetReadDeadline(time.Time{})
		if _, err := r.Peek(1); err != nil {
			break
		}
		_ = c.SetReadDeadline(time.Now().Add(lineTimeout))
		req, err := readRequest(r)
		if err != nil || req.Op != rankv1.OpReady {
			break
		}
		w.once.Do(func() { close(w.ready) })
	}
	ep.mu.Lock()
	delete(ep.watchers, w)
	ep.mu.Unlock()
}

// maxSocketPath is the longest path bind(2) takes for a unix socket
// (sun_path's 108 bytes, less the final NUL).
const maxSocketPath = 107

// listenUnix listens on a unix socket at path. A path too long for
// sun_path (a data dir deep in a file system) is bound through the
// directory's file descriptor, /proc/self/fd/N/NAME, which the kernel
// resolves to the same place: the rank, which connects to its own short
// path in the container, finds it there all the same.
func listenUnix(path string) (*net.UnixListener, error) {
	if len(path) <= maxSocketPath {
		return net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	}
	fd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Dir(path), Err: err}
	}
	defer unix.Close(fd)
	short := fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(path))
	if len(short) > maxSocketPath {
		return nil, fmt.Errorf("socket name %s too long", filepath.Base(path))
	}
	return net.ListenUnix("unix", &net.UnixAddr{Name: short, Net: "unix"})
}
