package v1

import (
	"context"
	"sync"
	"time"
)

// MaxID bounds a request's ID.
const MaxID = 64

// ValidID says whether id may name a request ("" names none).
func ValidID(id string) bool {
	if len(id) > MaxID {
		return false
	}
	for _, c := range []byte(id) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Replies are what an endpoint keeps of the requests with an ID it
// carried out lately, one rank's: a request sent again (its connection
// closed before the reply, as when the rank is quiesced for a dump) is
// answered with the first reply, not carried out twice. It keeps the
// newest Keep replies, none older than For; the zero value keeps 256 for
// 10 minutes. Safe for concurrent use.
type Replies struct {
	Keep int
	For  time.Duration
	Now  func() time.Time // default time.Now

	mu    sync.Mutex
	byID  map[string]*kept
	order []string // oldest first
}

type kept struct {
	at    time.Time
	done  chan struct{} // closed once reply is set
	reply Reply
}

// Do answers req: by do() the first time its ID comes with its Op, and
// with that reply (waiting for it, while ctx lasts) every other time.
// Without an ID it is do(). The second value says whether do ran.
func (r *Replies) Do(ctx context.Context, req Request, do func() Reply) (Reply, bool) {
	if req.ID == "" {
		return do(), true
	}
	id := req.Op + " " + req.ID
	r.mu.Lock()
	now := r.now()
	r.prune(now)
	if k := r.byID[id]; k != nil {
		r.mu.Unlock()
		select {
		case <-k.done:
			return k.reply, false
		case <-ctx.Done():
			return Reply{Code: CodeUnavailable, Error: "the first " + req.Op + " of id " + req.ID + " is still being carried out"}, false
		}
	}
	if r.byID == nil {
		r.byID = map[string]*kept{}
	}
	k := &kept{at: now, done: make(chan struct{})}
	r.byID[id] = k
	r.order = append(r.order, id)
	r.mu.Unlock()
	k.reply = do()
	close(k.done)
	return k.reply, true
}

// prune forgets the replies beyond Keep or older than For; r.mu is held.
func (r *Replies) prune(now time.Time) {
	keep, age := r.Keep, r.For
	if keep <= 0 {
		keep = 256
	}
	if age <= 0 {
		age = 10 * time.Minute
	}
	n := 0
	for n < len(r.order) && (len(r.order)-n >= keep || now.Sub(r.byID[r.order[n]].at) > age) {
		delete(r.byID, r.order[n])
		n++
	}
	r.order = r.order[n:]
}

func (r *Replies) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
