package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

// fakeRankCoord answers a rank's requests as a coordinator would; ckpt
// blocks RankCheckpoint until the test sends its outcome.
type fakeRankCoord struct {
	mu     sync.Mutex
	last   int
	asked  []coordv1.RankRequest
	events []coordv1.RankRequest
	ckpt   chan error
	evErr  error
	evGate chan struct{} // if set, RankEvent returns once it is closed
	infos  int
}

func (f *fakeRankCoord) RankCheckpoint(ctx context.Context, req coordv1.RankRequest) (coordv1.Ckpt, error) {
	f.mu.Lock()
	f.asked = append(f.asked, req)
	f.mu.Unlock()
	if err := <-f.ckpt; err != nil {
		return coordv1.Ckpt{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last++
	return coordv1.Ckpt{Job: req.Job, Seq: f.last}, nil
}

func (f *fakeRankCoord) RankInfo(ctx context.Context, req coordv1.RankRequest) (coordv1.RankInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.infos++
	return coordv1.RankInfo{Ckpt: f.last, Mode: coordv1.ModeTransparent}, nil
}

func (f *fakeRankCoord) RankEvent(ctx context.Context, req coordv1.RankRequest) error {
	f.mu.Lock()
	f.events = append(f.events, req)
	gate := f.evGate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.evErr
}

// rankAPIEnv is an endpoint for container "j.1" (rank 1 of job j) in a
// temporary dir, served with a fake coordinator.
type rankAPIEnv struct {
	t    *testing.T
	eps  *endpoints
	co   *fakeRankCoord
	sock string
	mu   sync.Mutex
	self rankSelf
}

func newRankAPIEnv(t *testing.T) *rankAPIEnv {
	t.Helper()
	dir, err := os.MkdirTemp("", "rankapi") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &rankAPIEnv{t: t, co: &fakeRankCoord{ckpt: make(chan error, 4)}, sock: filepath.Join(dir, "rank.sock"),
		self: rankSelf{Job: "j", Rank: 1, Size: 4, Mode: rankv1.ModeTransparent, Incarnation: 1}}
	lookup := func(ctx context.Context, name string) (rankSelf, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.self, nil
	}
	e.eps = newEndpoints(func(string) string { return dir }, lookup, func() RankCoordinator { return e.co },
		slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err := e.eps.open("j.1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.eps.close("j.1") })
	return e
}

// ask sends one request and returns the reply.
func (e *rankAPIEnv) ask(req string) rankv1.Reply {
	e.t.Helper()
	c, err := net.Dial("unix", e.sock)
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(req + "\n")); err != nil {
		e.t.Fatal(err)
	}
	var r rankv1.Reply
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		e.t.Fatalf("%s: read the reply: %v", req, err)
	}
	if err := json.Unmarshal(line, &r); err != nil {
		e.t.Fatalf("%s: reply %q: %v", req, line, err)
	}
	return r
}

func wantReply(t *testing.T, r rankv1.Reply, code string) {
	t.Helper()
	if r.OK || r.Code != code {
		t.Fatalf("reply %+v, want code %s", r, code)
	}
}

// TestRankAPIRequests: info, a rank's own job only, events checked and
// forwarded, bad requests refused.
func TestRankAPIRequests(t *testing.T) {
	e := newRankAPIEnv(t)
	r := e.ask(`{"op":"info"}`)
	if !r.OK || r.Job != "j" || r.Rank == nil || *r.Rank != 1 || r.Size != 4 || r.Restored || r.Incarnation != 1 {
		t.Fatalf("info: %+v", r)
	}
	wantReply(t, e.ask(`{"op":"checkpoint","job":"other"}`), rankv1.CodeForbidden)
	wantReply(t, e.ask(`{"op":"info","rank":2}`), rankv1.CodeForbidden)
	wantReply(t, e.ask(`{"op":"nope"}`), rankv1.CodeBadRequest)
	wantReply(t, e.ask(`not json`), rankv1.CodeBadRequest)
	wantReply(t, e.ask(`{"op":"info","pad":"`+strings.Repeat("x", rankv1.MaxLine)+`"}`), rankv1.CodeBadRequest)
	wantReply(t, e.ask(`{"op":"event","kind":"a b","message":"x"}`), rankv1.CodeBadRequest)
	wantReply(t, e.ask(`{"op":"event","kind":"k","message":"`+strings.Repeat("x", rankv1.MaxMessage+1)+`"}`), rankv1.CodeBadRequest)
	if r := e.ask(`{"op":"event","kind":"phase","message":"step 10"}`); !r.OK {
		t.Fatalf("event: %+v", r)
	}
	e.co.evErr = &coordv1.Error{Code: coordv1.CodeRateLimited, Message: "too many"}
	wantReply(t, e.ask(`{"op":"event","kind":"phase","message":"step 11"}`), rankv1.CodeRateLimited)
	if len(e.co.events) != 2 || e.co.events[0] != (coordv1.RankRequest{Job: "j", Rank: 1, Kind: "phase", Message: "step 10"}) {
		t.Fatalf("events forwarded: %+v", e.co.events)
	}
	if len(e.co.asked) != 0 {
		t.Fatalf("a refused checkpoint reached the coordinator: %+v", e.co.asked)
	}
}

// TestRankAPICheckpoint: a checkpoint asked for returns a ticket at once;
// its result is pending, then done or failed; a rank restored since it
// asked is told so, on this node or another.
func TestRankAPICheckpoint(t *testing.T) {
	e := newRankAPIEnv(t)
	r := e.ask(`{"op":"checkpoint"}`)
	if !r.OK || r.Ticket == "" || r.State != rankv1.StatePending {
		t.Fatalf("checkpoint: %+v", r)
	}
	ticket := r.Ticket
	if r := e.ask(`{"op":"result","ticket":"` + ticket + `"}`); r.State != rankv1.StatePending {
		t.Fatalf("result before the round ended: %+v", r)
	}
	e.co.ckpt <- nil
	waitResult := func(ticket, state string) rankv1.Reply {
		t.Helper()
		for range 200 {
			if r := e.ask(`{"op":"result","ticket":"` + ticket + `"}`); r.State != rankv1.StatePending {
				if r.State != state {
					t.Fatalf("result: %+v, want %s", r, state)
				}
				return r
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("ticket %s still pending", ticket)
		return rankv1.Reply{}
	}
	if r := waitResult(ticket, rankv1.StateDone); r.Ckpt != 1 {
		t.Fatalf("done: %+v", r)
	}
	if r := e.ask(`{"op":"info"}`); r.Ckpt != 1 {
		t.Fatalf("info after the checkpoint: %+v", r)
	}
	// An aborted round.
	t2 := e.ask(`{"op":"checkpoint","stop":true}`).Ticket
	e.co.ckpt <- &coordv1.Error{Code: coordv1.CodeAborted, Message: "checkpoint j:2 aborted"}
	if r := waitResult(t2, rankv1.StateFailed); r.Code != rankv1.CodeAborted {
		t.Fatalf("aborted: %+v", r)
	}
	if !e.co.asked[1].Stop {
		t.Fatalf("stop not forwarded: %+v", e.co.asked)
	}
	// The rank asks, is checkpointed (frozen meanwhile), and later
	// restored from that checkpoint: the same question now says so.
	t3 := e.ask(`{"op":"checkpoint"}`).Ticket
	e.mu.Lock()
	e.self.Incarnation, e.self.RestoredFrom = 2, 3
	e.mu.Unlock()
	if r := e.ask(`{"op":"result","ticket":"` + t3 + `"}`); r.State != rankv1.StateRestored || r.RestoredFrom != 3 {
		t.Fatalf("result after a restore: %+v", r)
	}
	// On another node nobody knows the ticket.
	if r := e.ask(`{"op":"result","ticket":"j.1-unknown"}`); r.State != rankv1.StateRestored || r.RestoredFrom != 3 {
		t.Fatalf("unknown ticket of a restored rank: %+v", r)
	}
	e.mu.Lock()
	e.self.RestoredFrom = 0
	e.mu.Unlock()
	wantReply(t, e.ask(`{"op":"result","ticket":"j.1-unknown"}`), rankv1.CodeNotFound)
	e.co.ckpt <- nil
}

// watch opens a watch connection and returns it with its reply.
func (e *rankAPIEnv) watch(deadlineMS int) (net.Conn, *bufio.Reader, rankv1.Reply) {
	e.t.Helper()
	c, err := net.Dial("unix", e.sock)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	req, _ := json.Marshal(rankv1.Request{Op: rankv1.OpWatch, Prepare: true, DeadlineMS: deadlineMS})
	if _, err := c.Write(append(req, '\n')); err != nil {
		e.t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var r rankv1.Reply
	line, err := br.ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &r) != nil || !r.OK {
		e.t.Fatalf("watch: %q %v", line, err)
	}
	return c, br, r
}

// TestRankAPIWatch: a watcher is told before the rank is frozen and the
// prepare waits for its ready; then the socket is gone and every
// connection closed until it is served again. A watcher that does not
// answer in time fails the prepare; an application-level rank that does
// not watch cannot be checkpointed.
func TestRankAPIWatch(t *testing.T) {
	e := newRankAPIEnv(t)
	c, br, r := e.watch(2000)
	if r.Incarnation != 1 || r.Job != "j" {
		t.Fatalf("watch reply: %+v", r)
	}
	idle, err := net.Dial("unix", e.sock) // an idle connection, to be closed too
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	done := make(chan error, 1)
	go func() { done <- e.eps.prepare(t.Context(), "j.1", 7, rankv1.ModeTransparent, false) }()
	line, err := br.ReadBytes('\n')
	var ev rankv1.Event
	if err != nil || json.Unmarshal(line, &ev) != nil || ev.Event != rankv1.EventPrepare || ev.Ckpt != 7 || ev.DeadlineMS != 2000 {
		t.Fatalf("prepare event: %q %v", line, err)
	}
	select {
	case err := <-done:
		t.Fatalf("prepare returned before the rank was ready: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := c.Write([]byte(`{"op":"ready"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("prepare: %v", err)
	}
	// Quiesced: no socket, and both connections closed by the agent.
	if _, err := os.Stat(e.sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket is still there while the rank is frozen: %v", err)
	}
	for _, conn := range []net.Conn{c, idle} {
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := conn.Read(make([]byte, 1)); err == nil {
			t.Fatalf("a connection still open after the prepare (read %d bytes)", n)
		}
	}
	if _, err := net.Dial("unix", e.sock); err == nil {
		t.Fatal("connected to a quiesced rank API")
	}
	// Committed here: the rank learns it as it runs again, before the
	// catalog says durable.
	e.eps.committed("j.1", 7)
	e.eps.reopen("j.1")
	if r := e.ask(`{"op":"info"}`); !r.OK || r.Ckpt != 7 {
		t.Fatalf("info once served again: %+v", r)
	}
	if _, _, r := e.watch(1000); r.Ckpt != 7 {
		t.Fatalf("watch after a commit: %+v", r)
	}

	// A watcher that never answers fails the prepare after its deadline.
	e.watch(300)
	start := time.Now()
	err = e.eps.prepare(t.Context(), "j.1", 8, rankv1.ModeTransparent, false)
	if err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("prepare with a silent watcher: %v", err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("gave up after %s, before the rank's 300ms", took)
	}
	e.eps.reopen("j.1")

	// Application-level: no watcher, no checkpoint.
	if err := e.eps.prepare(t.Context(), "j.1", 9, rankv1.ModeApp, true); err == nil {
		t.Fatal("an application-level prepare of a rank that does not watch succeeded")
	}
	e.eps.reopen("j.1")
	// Without watchers, a transparent prepare only quiesces.
	if err := e.eps.prepare(t.Context(), "j.1", 10, rankv1.ModeTransparent, false); err != nil {
		t.Fatal(err)
	}
}

// TestRankAPIQuiesceBacklog: connections made just before a prepare,
// accepted or still in the listener's backlog, all end with it (the rank
// sees each closed or reset), so that none is open for the dump; and a
// prepare without watchers does not wait for connections to come.
func TestRankAPIQuiesceBacklog(t *testing.T) {
	e := newRankAPIEnv(t)
	var conns []net.Conn
	for range 16 {
		c, err := net.Dial("unix", e.sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	if err := e.eps.prepare(t.Context(), "j.1", 1, rankv1.ModeTransparent, false); err != nil {
		t.Fatal(err)
	}
	reset := 0
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.Read(make([]byte, 1))
		switch {
		case errors.Is(err, syscall.ECONNRESET):
			reset++ // released from the backlog
		case errors.Is(err, io.EOF):
		default:
			t.Fatalf("connection %d after the prepare: read %v, want it closed or reset", i, err)
		}
	}
	t.Logf("%d of %d connections released from the backlog, the others accepted and closed", reset, len(conns))
	if _, err := net.Dial("unix", e.sock); err == nil {
		t.Fatal("connected to a quiesced rank API")
	}
}

// TestRankAPIForbiddenByTheCoordinator: what the coordinator refuses is
// forbidden for the rank too.
func TestRankAPIForbiddenByTheCoordinator(t *testing.T) {
	r := coordFail(&coordv1.Error{Code: agentv1.CodeForbidden, Message: "node n1 holds no rank 1 of job j"})
	wantReply(t, r, rankv1.CodeForbidden)
	wantReply(t, coordFail(errors.New("connection refused")), rankv1.CodeUnavailable)
}

// TestRankAPIRequestSentAgain: a request whose connection is closed
// before its reply (the rank is quiesced for a dump while the agent
// carries it out) and that the rank sends again with its id once the
// socket is back is carried out once: the repeat gets the first reply.
func TestRankAPIRequestSentAgain(t *testing.T) {
	e := newRankAPIEnv(t)
	e.co.evGate = make(chan struct{})
	c, err := net.Dial("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(`{"op":"event","id":"ev-1","kind":"phase","message":"step 10"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		e.co.mu.Lock()
		n := len(e.co.events)
		e.co.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the event never reached the coordinator")
		}
	}
	e.eps.quiesce("j.1")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(c).ReadBytes('\n'); err == nil {
		t.Fatalf("a reply on a quiesced connection: %q", line)
	}
	e.eps.reopen("j.1")
	again := make(chan rankv1.Reply)
	go func() { again <- e.ask(`{"op":"event","id":"ev-1","kind":"phase","message":"step 10"}`) }()
	time.Sleep(50 * time.Millisecond) // the repeat waits for the first
	close(e.co.evGate)
	if r := <-again; !r.OK {
		t.Fatalf("the repeat: %+v", r)
	}
	if r := e.ask(`{"op":"event","id":"ev-1","kind":"phase","message":"step 10"}`); !r.OK {
		t.Fatalf("a second repeat: %+v", r)
	}
	if r := e.ask(`{"op":"event","id":"ev-2","kind":"phase","message":"step 11"}`); !r.OK {
		t.Fatalf("another event: %+v", r)
	}
	e.co.mu.Lock()
	n := len(e.co.events)
	e.co.mu.Unlock()
	if n != 2 {
		t.Errorf("%d events reached the coordinator, want 2 (ev-1 once, ev-2)", n)
	}

	// A checkpoint sent again is the same ticket, asked of the
	// coordinator once.
	first := e.ask(`{"op":"checkpoint","id":"ck-1"}`)
	second := e.ask(`{"op":"checkpoint","id":"ck-1"}`)
	if !first.OK || first.Ticket == "" || second.Ticket != first.Ticket {
		t.Fatalf("checkpoint %+v, sent again %+v: want the same ticket", first, second)
	}
	e.co.ckpt <- nil
	asked := func() int {
		e.co.mu.Lock()
		defer e.co.mu.Unlock()
		return len(e.co.asked)
	}
	for deadline := time.Now().Add(5 * time.Second); asked() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a second round would be asked by now
	if n := asked(); n != 1 {
		t.Errorf("the coordinator was asked for %d checkpoints, want 1", n)
	}
	wantReply(t, e.ask(`{"op":"checkpoint","id":"a b"}`), rankv1.CodeBadRequest)
	wantReply(t, e.ask(`{"op":"event","id":"`+strings.Repeat("x", rankv1.MaxID+1)+`","kind":"k"}`), rankv1.CodeBadRequest)
}

// TestRankAPIConnectionCap: a rank that holds connections open without
// asking anything gets at most maxRankConns of them; the next is told
// why and hung up, and once it lets some go it is served again.
func TestRankAPIConnectionCap(t *testing.T) {
	e := newRankAPIEnv(t)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range maxRankConns {
		c, err := net.Dial("unix", e.sock)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	testutilWait(t, func() bool {
		e.eps.mu.Lock()
		ep := e.eps.byName["j.1"]
		e.eps.mu.Unlock()
		ep.mu.Lock()
		defer ep.mu.Unlock()
		return len(ep.conns) == maxRankConns
	})
	// The refusal comes whatever the rank sends (here nothing).
	over, err := net.Dial("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	_ = over.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(over).ReadBytes('\n')
	over.Close()
	var r rankv1.Reply
	if err != nil || json.Unmarshal(line, &r) != nil {
		t.Fatalf("a connection over the cap: %q %v, want a refusal", line, err)
	}
	wantReply(t, r, rankv1.CodeUnavailable)
	wantReply(t, e.ask(`{"op":"info"}`), rankv1.CodeUnavailable) // a request sent, read
	if !strings.Contains(r.Error, "connections") {
		t.Fatalf("refusal %q does not say why", r.Error)
	}
	held[0].Close()
	held = held[1:]
	testutilWait(t, func() bool {
		c, err := net.Dial("unix", e.sock)
		if err != nil {
			return false
		}
		defer c.Close()
		if _, err := c.Write([]byte(`{"op":"info"}` + "\n")); err != nil {
			return false
		}
		line, _ := bufio.NewReader(c).ReadBytes('\n')
		var r rankv1.Reply
		return json.Unmarshal(line, &r) == nil && r.OK
	})
}

// TestRankAPIAcceptOutOfDescriptors: an accept that fails because the
// agent has no file descriptor left (EMFILE) does not end the socket's
// accept loop: once descriptors are free again, the rank is served.
func TestRankAPIAcceptOutOfDescriptors(t *testing.T) {
	e := newRankAPIEnv(t)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = uint64(len(fds) + 8)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	// Dial until the process runs out: the accepts of the last ones fail.
	var held []net.Conn
	for range 64 {
		c, err := net.Dial("unix", e.sock)
		if err != nil {
			break
		}
		held = append(held, c)
	}
	time.Sleep(100 * time.Millisecond) // the accept loop meets EMFILE
	for _, c := range held {
		c.Close()
	}
	restore()
	c, err := net.Dial("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(`{"op":"info"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		t.Fatalf("no reply once descriptors are free again: %v (the accept loop ended)", err)
	}
	var r rankv1.Reply
	if err := json.Unmarshal(line, &r); err != nil || !r.OK {
		t.Fatalf("reply %q: %v", line, err)
	}
}

// testutilWait polls cond for up to 5 s.
func testutilWait(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
	}
}

// TestRankAPIWatchHalfALine: a watcher that sends part of a line and no
// more loses its watch after lineTimeout: it holds no agent memory for
// good. A watcher that sends nothing keeps its watch.
func TestRankAPIWatchHalfALine(t *testing.T) {
	defer func(d time.Duration) { lineTimeout = d }(lineTimeout)
	lineTimeout = 200 * time.Millisecond
	e := newRankAPIEnv(t)
	quiet, _, _ := e.watch(1000)
	half, br, _ := e.watch(1000)
	if _, err := half.Write([]byte(`{"op":"rea`)); err != nil {
		t.Fatal(err)
	}
	_ = half.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadBytes('\n'); !errors.Is(err, io.EOF) {
		t.Fatalf("a watch holding half a line: %v, want it hung up", err)
	}
	time.Sleep(2 * lineTimeout)
	e.eps.mu.Lock()
	ep := e.eps.byName["j.1"]
	e.eps.mu.Unlock()
	ep.mu.Lock()
	n := len(ep.watchers)
	ep.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d watchers, want the quiet one only", n)
	}
	quiet.Close()
}

// FuzzRankAPI sends what a hostile rank could on its socket, then hangs
// up: the agent answers with nothing but whole JSON replies, one a line,
// each about the rank's own job if about any, and never more replies than
// the lines it was sent.
func FuzzRankAPI(f *testing.F) {
	for _, s := range []string{`{"op":"info"}` + "\n", `{"op":"info","job":"other"}` + "\n", `{"op":"checkpoint","id":"a-1"}` + "\n",
		`{"op":"event","kind":"step","message":"\u001b[2K"}` + "\n", `{"op":"watch","prepare":true,"deadline_ms":5}` + "\n" + `{"op":"rea`,
		`{"op":"info","rank":7}` + "\n", "\x00\xff\n", `{"op":"result","ticket":"../x"}` + "\n", strings.Repeat("x", rankv1.MaxLine+10) + "\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		e := newRankAPIEnv(t)
		e.co.ckpt = make(chan error, 64)
		for range 64 {
			e.co.ckpt <- nil
		}
		c, err := net.Dial("unix", e.sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(in); err != nil {
			return // hung up on already: nothing to check
		}
		_ = c.(*net.UnixConn).CloseWrite()
		out, _ := io.ReadAll(c)
		lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if len(out) == 0 {
			return
		}
		if len(lines) > strings.Count(string(in), "\n")+1 {
			t.Fatalf("%d replies to %d lines", len(lines), strings.Count(string(in), "\n"))
		}
		for _, l := range lines {
			var r rankv1.Reply
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("reply %q is no JSON: %v", l, err)
			}
			if r.OK && r.Job != "" && r.Job != "j" {
				t.Fatalf("a reply about job %q to rank 1 of job j: %q", r.Job, l)
			}
		}
	})
}

// TestRankAPIDeepDir: a rank's socket in a dir whose path is too long for
// a unix socket's address (a data dir deep in a file system) is served
// all the same; it used to be left unserved, with a warning in the log.
func TestRankAPIDeepDir(t *testing.T) {
	dir := t.TempDir()
	for len(dir) <= maxSocketPath {
		dir = filepath.Join(dir, "a-long-directory-name")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	lookup := func(ctx context.Context, name string) (rankSelf, error) {
		return rankSelf{Job: "j", Rank: 1, Size: 4, Mode: rankv1.ModeTransparent, Incarnation: 1}, nil
	}
	eps := newEndpoints(func(string) string { return dir }, lookup, func() RankCoordinator { return &fakeRankCoord{} },
		slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err := eps.open("j.1"); err != nil {
		t.Fatal(err)
	}
	defer eps.close("j.1")
	// The client reaches it as the rank would through its own short path:
	// here, through the dir's descriptor.
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := net.Dial("unix", fmt.Sprintf("/proc/self/fd/%d/rank.sock", d.Fd()))
	if err != nil {
		t.Fatalf("dial the rank API in a deep dir: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(`{"op":"info"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	var r rankv1.Reply
	if err != nil || json.Unmarshal(line, &r) != nil || !r.OK {
		t.Fatalf("info in a deep dir: %q, %v", line, err)
	}
}

// TestRankAPIPaced: a rank's requests that reach the coordinator are
// paced: past the burst each waits its turn, none is refused, and the
// coordinator sees them no faster than the rate.
func TestRankAPIPaced(t *testing.T) {
	e := newRankAPIEnv(t)
	const n = rankCoordBurst + rankCoordRate // a second's worth past the burst
	start := time.Now()
	for range n {
		if r := e.ask(`{"op":"info"}`); !r.OK {
			t.Fatalf("info: %+v", r)
		}
	}
	took := time.Since(start)
	e.co.mu.Lock()
	infos := e.co.infos
	e.co.mu.Unlock()
	if infos != n {
		t.Errorf("the coordinator was asked %d times, want %d", infos, n)
	}
	// The pace is a floor: n asks cannot take less than the rate allows.
	if floor := time.Duration(n-rankCoordBurst) * time.Second / rankCoordRate; took < floor*9/10 {
		t.Errorf("%d asks took %s, less than the pace allows (%s)", n, took, floor)
	}
}
