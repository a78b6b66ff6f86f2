package ranktest

// The fake's checkpoint rounds, results, events and watch connections.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

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
		line, err := rankv1.ReadLine(r)
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
