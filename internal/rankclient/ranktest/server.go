package ranktest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

// Outcome is what a round ends in.
type Outcome int

const (
	// Done: the checkpoint commits and the rank resumes.
	Done Outcome = iota
	// Aborted: the round aborts (another rank failed its prepare) after
	// this rank was frozen; it resumes.
	Aborted
	// Restored: the checkpoint commits, and the rank then runs restored
	// from it, in a new incarnation (its node failed meanwhile, say).
	Restored
	// Conflict: the job cannot be checkpointed now; the checkpoint
	// request is refused at once (conflict).
	Conflict
)

func (o Outcome) String() string {
	return [...]string{"done", "aborted", "restored", "conflict"}[o]
}

// Config says which rank a Server stands for and how its rounds go.
type Config struct {
	// Dir holds the socket (Dir/rank.sock); New uses a temporary
	// directory when it is empty.
	Dir string
	// The rank: Job (default "sim"), Rank, Size (default 4) and Mode
	// (default transparent); Ckpt is the job's newest checkpoint to begin
	// with.
	Job        string
	Rank, Size int
	Mode       string
	Ckpt       int
	// Pending is how long a round stays pending before its prepare
	// (default 100 ms); Frozen how long the socket is away (default
	// 200 ms).
	Pending, Frozen time.Duration
	// DeadlineMS is what a round has left for ready when it prepares
	// (default 5000): a watcher has the smaller of it and its own.
	DeadlineMS int
	// Now is the event rate limiter's clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Event is an event a rank published.
type Event struct{ Kind, Message string }

// The job's event rate: 10 a second, bursts of 20.
const (
	eventRate  = 10
	eventBurst = 20
)

var kindRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,32}$`)

// Server is a fake rank endpoint. Its methods are safe for concurrent use.
type Server struct {
	cfg    Config
	path   string
	logger *slog.Logger
	done   chan struct{}
	wg     sync.WaitGroup

	mu           sync.Mutex
	ln           *net.UnixListener // nil while the rank is frozen
	conns        map[net.Conn]struct{}
	watchers     map[*watcher]struct{}
	ckpt         int
	incarnation  int
	restoredFrom int
	tickets      map[string]*ticket
	next         []Outcome
	round        *round
	events       []Event
	tokens       float64
	last         time.Time
	trace        []string
	closed       bool
	lose         map[string]int // op: how many of its next replies to lose
	replies      rankv1.Replies
}

// ticket is what a rank's checkpoint request became.
type ticket struct {
	incarnation int // when it was asked for
	state       string
	ckpt        int
	err         string
}

// round is a checkpoint of the job under way.
type round struct {
	ckpt    int
	outcome Outcome
	tickets []*ticket
}

// watcher is a watch connection.
type watcher struct {
	conn       net.Conn
	prepare    bool
	deadlineMS int
	ready      chan struct{} // a ready came
	gone       chan struct{} // closed when the connection ends
	wmu        sync.Mutex
}

// New starts a Server for a test and closes it when the test ends.
func New(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.Dir == "" {
		// A short path: a unix socket's must fit in 108 bytes.
		dir, err := os.MkdirTemp("", "rank")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		cfg.Dir = dir
	}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Start listens on cfg.Dir/rank.sock.
func Start(cfg Config) (*Server, error) {
	if cfg.Job == "" {
		cfg.Job = "sim"
	}
	if cfg.Size == 0 {
		cfg.Size = 4
	}
	if cfg.Mode == "" {
		cfg.Mode = rankv1.ModeTransparent
	}
	if cfg.Pending == 0 {
		cfg.Pending = 100 * time.Millisecond
	}
	if cfg.Frozen == 0 {
		cfg.Frozen = 200 * time.Millisecond
	}
	if cfg.DeadlineMS == 0 {
		cfg.DeadlineMS = 5000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:         cfg,
		path:        filepath.Join(cfg.Dir, "rank.sock"),
		logger:      cfg.Logger.With("job", cfg.Job, "rank", cfg.Rank),
		done:        make(chan struct{}),
		conns:       map[net.Conn]struct{}{},
		watchers:    map[*watcher]struct{}{},
		ckpt:        cfg.Ckpt,
		incarnation: 1,
		tickets:     map[string]*ticket{},
		tokens:      eventBurst,
		last:        cfg.Now(),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.listen(); err != nil {
		return nil, err
	}
	return s, nil
}

// Path is the socket's path (for $CAIRN_SOCKET).
func (s *Server) Path() string { return s.path }

// Close stops the server and removes its socket.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.dropAll()
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// Next sets what the next checkpoints the rank asks for end in, in order;
// once they are used up, a checkpoint is Done.
func (s *Server) Next(o ...Outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next = append(s.next, o...)
}

// Checkpoint runs a round the rank did not ask for, as cairn's own
// checkpoints and migrations are, and returns when the rank runs again.
// It fails if a round is under way.
func (s *Server) Checkpoint(o Outcome) error {
	s.mu.Lock()
	if s.round != nil || s.closed {
		s.mu.Unlock()
		return errors.New("a round is under way, or the server is closed")
	}
	rd := &round{ckpt: s.ckpt + 1, outcome: o}
	s.round = rd
	s.wg.Add(1)
	s.mu.Unlock()
	s.run(rd)
	return nil
}

// LoseReply makes the server carry out the next request of op, then
// close its connection without the reply, as the agent does when it
// quiesces a rank meanwhile ("reply lost" in the trace). A client that
// sends it again with its id is answered from the first ("repeat OP").
func (s *Server) LoseReply(op string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lose == nil {
		s.lose = map[string]int{}
	}
	s.lose[op]++
}

// State is what info says now.
func (s *Server) State() rankv1.Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state()
}

// Events are the events published so far.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

// Trace is what happened so far, in order: "checkpoint" (a rank asked),
// "round N", "prepare N" (sent to a watcher), "ready", "no ready"
// (not in time, or the watcher left), "freeze", "commit N", "abort N",
// "restore N", "thaw", "event KIND", "rate_limited", "reply lost"
// (LoseReply), "repeat OP" (a request sent again, answered with its first
// reply).
func (s *Server) Trace() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.trace...)
}

// Watchers is how many watch connections are open.
func (s *Server) Watchers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers)
}

func (s *Server) note(format string, args ...any) {
	e := fmt.Sprintf(format, args...)
	s.trace = append(s.trace, e)
	s.logger.Debug("rank endpoint: " + e)
}

// listen opens the socket; s.mu is held.
func (s *Server) listen() error {
	os.Remove(s.path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.path, Net: "unix"})
	if err != nil {
		return err
	}
	s.ln = ln
	s.wg.Add(1)
	go s.accept(ln)
	return nil
}

// dropAll removes the socket and closes every connection; s.mu is held.
func (s *Server) dropAll() {
	if s.ln != nil {
		s.ln.Close() // unlinks the socket
		s.ln = nil
	}
	for c := range s.conns {
		c.Close()
	}
	clear(s.conns)
	clear(s.watchers)
}

func (s *Server) accept(ln *net.UnixListener) {
	defer s.wg.Done()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.ln != ln { // frozen or closed meanwhile
			s.mu.Unlock()
			conn.Close()
			continue
		}
		s.conns[conn] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(conn)
	}
}

func fail(code, format string, args ...any) rankv1.Reply {
	return rankv1.Reply{Code: code, Error: fmt.Sprintf(format, args...)}
}

// write sends one message.
func write(conn net.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = conn.Write(append(b, '\n'))
	return err
}

func (s *Server) serve(conn net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
		conn.Close()
	}()
	r := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := rankv1.ReadLine(r)
	if errors.Is(err, rankv1.ErrTooLong) {
		write(conn, fail(rankv1.CodeBadRequest, "a message is at most %d bytes", rankv1.MaxLine))
		return
	} else if err != nil {
		return
	}
	var req rankv1.Request
	if err := json.Unmarshal(line, &req); err != nil {
		write(conn, fail(rankv1.CodeBadRequest, "malformed request: %v", err))
		return
	}
	if !rankv1.ValidID(req.ID) {
		write(conn, fail(rankv1.CodeBadRequest, "a request id is 1 to %d letters, digits, '-' or '_'", rankv1.MaxID))
		return
	}
	var reply rankv1.Reply
	var w *watcher
	switch req.Op {
	case rankv1.OpCheckpoint, rankv1.OpEvent:
		var did bool
		reply, did = s.replies.Do(context.Background(), req, func() rankv1.Reply { r, _ := s.handle(conn, req); return r })
		s.mu.Lock()
		if !did {
			s.note("repeat %s", req.Op)
		}
		lost := s.lose[req.Op] > 0
		if lost {
			s.lose[req.Op]--
			s.note("reply lost")
		}
		s.mu.Unlock()
		if lost {
			return
		}
	default:
		reply, w = s.handle(conn, req)
	}
	err = write(conn, reply)
	if w != nil {
		conn.SetReadDeadline(time.Time{})
		s.watchLoop(w, r, err == nil)
	}
}

// handle answers req; for a watch, it returns the watcher registered.
func (s *Server) handle(conn net.Conn, req rankv1.Request) (rankv1.Reply, *watcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Job != "" && req.Job != s.cfg.Job {
		return fail(rankv1.CodeForbidden, "job %s is not this rank's", req.Job), nil
	}
	if req.Rank != nil && *req.Rank != s.cfg.Rank {
		return fail(rankv1.CodeForbidden, "rank %d is not the caller", *req.Rank), nil
	}
	switch req.Op {
	case rankv1.OpInfo:
		return s.state(), nil
	case rankv1.OpCheckpoint:
		return s.checkpoint(req), nil
	case rankv1.OpResult:
		return s.result(req.Ticket), nil
	case rankv1.OpEvent:
		return s.event(req.Kind, req.Message), nil
	case rankv1.OpWatch:
		if req.DeadlineMS < 0 {
			return fail(rankv1.CodeBadRequest, "deadline_ms %d", req.DeadlineMS), nil
		}
		w := &watcher{conn: conn, prepare: req.Prepare, deadlineMS: req.DeadlineMS, ready: make(chan struct{}, 1), gone: make(chan struct{})}
		s.watchers[w] = struct{}{}
		return s.state(), w
	case rankv1.OpReady:
		return fail(rankv1.CodeBadRequest, "ready answers a prepare, on a watch connection"), nil
	}
	return fail(rankv1.CodeBadRequest, "unknown op %q", req.Op), nil
}

// state is the rank's info; s.mu is held.
func (s *Server) state() rankv1.Reply {
	rank := s.cfg.Rank
	return rankv1.Reply{
		OK: true, Job: s.cfg.Job, Rank: &rank, Size: s.cfg.Size, Mode: s.cfg.Mode,
		Ckpt: s.ckpt, Restored: s.restoredFrom > 0, RestoredFrom: s.restoredFrom, Incarnation: s.incarnation,
	}
}
