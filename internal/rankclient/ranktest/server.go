package ranktest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	rankv1 "cairn/api/rank/v1"
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
// "restore N", "thaw", "event KIND", "rate_limited".
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

var errTooLong = errors.New("message longer than 64 KiB")

// readLine reads one message, newline included, of at most MaxLine bytes.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		b, err := r.ReadSlice('\n')
		line = append(line, b...)
		if len(line) > rankv1.MaxLine {
			return nil, errTooLong
		}
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
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
	line, err := readLine(r)
	if errors.Is(err, errTooLong) {
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
	reply, w := s.handle(conn, req)
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

func (s *Server) checkpoint(req rankv1.Request) rankv1.Reply {
	if s.closed {
		return fail(rankv1.CodeUnavailable, "closed")
	}
	if req.Stop {
		s.note("checkpoint stop") // the job is not stopped here: the rank runs on
	} else {
		s.note("checkpoint")
	}
	rd := s.round
	if rd == nil {
		o := Done
		if len(s.next) > 0 {
			o, s.next = s.next[0], s.next[1:]
		}
		if o == Conflict {
			return fail(rankv1.CodeConflict, "job %s cannot be checkpointed now", s.cfg.Job)
		}
		rd = &round{ckpt: s.ckpt + 1, outcome: o}
		s.round = rd
		s.wg.Add(1)
		go s.run(rd)
	}
	id := fmt.Sprintf("%s.%d-%06x", s.cfg.Job, s.cfg.Rank, rand.Uint32()&0xffffff)
	for s.tickets[id] != nil {
		id = fmt.Sprintf("%s.%d-%06x", s.cfg.Job, s.cfg.Rank, rand.Uint32()&0xffffff)
	}
	t := &ticket{incarnation: s.incarnation, state: rankv1.StatePending}
	s.tickets[id] = t
	rd.tickets = append(rd.tickets, t)
	return rankv1.Reply{OK: true, Ticket: id}
}

func (s *Server) result(id string) rankv1.Reply {
	if id == "" {
		return fail(rankv1.CodeBadRequest, "result needs a ticket")
	}
	t := s.tickets[id]
	if t == nil {
		return fail(rankv1.CodeNotFound, "no ticket %s", id)
	}
	if s.incarnation > t.incarnation {
		return rankv1.Reply{OK: true, State: rankv1.StateRestored, RestoredFrom: s.restoredFrom}
	}
	switch t.state {
	case rankv1.StateFailed:
		return rankv1.Reply{State: rankv1.StateFailed, Code: rankv1.CodeAborted, Error: t.err}
	case rankv1.StateDone:
		return rankv1.Reply{OK: true, State: rankv1.StateDone, Ckpt: t.ckpt}
	}
	return rankv1.Reply{OK: true, State: rankv1.StatePending}
}

func (s *Server) event(kind, message string) rankv1.Reply {
	if !kindRE.MatchString(kind) {
		return fail(rankv1.CodeBadRequest, "event kind %q: 1-%d letters, digits, '.', '-', '_'", kind, rankv1.MaxKind)
	}
	if len(message) > rankv1.MaxMessage {
		return fail(rankv1.CodeBadRequest, "event message of %d bytes: at most %d", len(message), rankv1.MaxMessage)
	}
	now := s.cfg.Now()
	s.tokens = min(eventBurst, s.tokens+now.Sub(s.last).Seconds()*eventRate)
	s.last = now
	if s.tokens < 1 {
		s.note("rate_limited")
		return fail(rankv1.CodeRateLimited, "job %s publishes more than %d events a second", s.cfg.Job, eventRate)
	}
	s.tokens--
	s.events = append(s.events, Event{kind, message})
	s.note("event %s", kind)
	return rankv1.Reply{OK: true}
}

// watchLoop reads what a watcher sends after its watch (if the reply to
// it went out): ready after a prepare; anything else ends the connection.
func (s *Server) watchLoop(w *watcher, r *bufio.Reader, replied bool) {
	defer func() {
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
		close(w.gone)
	}()
	for replied {
		line, err := readLine(r)
		if err != nil {
			return
		}
		var req rankv1.Request
		if json.Unmarshal(line, &req) != nil || req.Op != rankv1.OpReady {
			w.wmu.Lock()
			write(w.conn, fail(rankv1.CodeBadRequest, "a watch connection takes ready only"))
			w.wmu.Unlock()
			return
		}
		select {
		case w.ready <- struct{}{}:
		default:
		}
	}
}

// run takes the rank through a round: pending, prepare, frozen, then the
// outcome.
func (s *Server) run(rd *round) {
	defer s.wg.Done()
	s.mu.Lock()
	s.note("round %d", rd.ckpt)
	s.mu.Unlock()
	if !s.sleep(s.cfg.Pending) {
		return
	}
	reason := s.prepare(rd.ckpt)
	if rd.outcome == Aborted && reason == "" {
		reason = "another rank's prepare failed"
	}
	s.mu.Lock()
	s.note("freeze")
	s.dropAll()
	s.mu.Unlock()
	if !s.sleep(s.cfg.Frozen) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for _, t := range rd.tickets {
		if reason != "" {
			t.state, t.err = rankv1.StateFailed, fmt.Sprintf("checkpoint %s:%d aborted: %s", s.cfg.Job, rd.ckpt, reason)
		} else {
			t.state, t.ckpt = rankv1.StateDone, rd.ckpt
		}
	}
	if reason != "" {
		s.note("abort %d", rd.ckpt)
	} else {
		s.ckpt = rd.ckpt
		s.note("commit %d", rd.ckpt)
		if rd.outcome == Restored {
			s.incarnation++
			s.restoredFrom = rd.ckpt
			s.note("restore %d", rd.ckpt)
		}
	}
	s.round = nil
	if err := s.listen(); err != nil {
		s.logger.Error("rank endpoint: listen again", "err", err)
		return
	}
	s.note("thaw")
}

// prepare tells every watcher that asked for it, and waits for their
// ready; it returns why the prepare failed, or "".
func (s *Server) prepare(ckpt int) string {
	s.mu.Lock()
	var ws []*watcher
	for w := range s.watchers {
		if w.prepare {
			ws = append(ws, w)
		}
	}
	if s.cfg.Mode == rankv1.ModeApp && len(ws) == 0 {
		s.mu.Unlock()
		return fmt.Sprintf("rank %d is not watching (application-level mode)", s.cfg.Rank)
	}
	s.mu.Unlock()
	reason := ""
	for _, w := range ws {
		d := s.cfg.DeadlineMS
		if w.deadlineMS > 0 && w.deadlineMS < d {
			d = w.deadlineMS
		}
		s.mu.Lock()
		s.note("prepare %d", ckpt)
		s.mu.Unlock()
		w.wmu.Lock()
		err := write(w.conn, rankv1.Event{Event: rankv1.EventPrepare, Ckpt: ckpt, Mode: s.cfg.Mode, DeadlineMS: d})
		w.wmu.Unlock()
		ok := false
		if err == nil {
			select {
			case <-w.ready:
				ok = true
			case <-time.After(time.Duration(d) * time.Millisecond):
			case <-w.gone:
			case <-s.done:
			}
		}
		s.mu.Lock()
		if ok {
			s.note("ready")
		} else {
			s.note("no ready")
			reason = fmt.Sprintf("rank %d did not answer its prepare within %d ms", s.cfg.Rank, d)
		}
		s.mu.Unlock()
	}
	return reason
}

// sleep waits d, or less if the server closes; it reports whether it is
// still open.
func (s *Server) sleep(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-s.done:
		return false
	}
}
