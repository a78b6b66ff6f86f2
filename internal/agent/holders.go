// The holders of an image that a fetch takes it from, and the shares of
// its chunk list they send.

package agent

import (
	"errors"
	"io"
	"sync"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/store"
)

// holder is one holder of the image, and what it has sent.
type holder struct {
	agentv1.Holder
	c *rpc.AgentClient

	mu      sync.Mutex
	chunks  int
	bytes   int64
	err     error // why it was given up; nil while it serves
	damaged bool
}

func (h *holder) add(chunks int, bytes int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.chunks += chunks
	h.bytes += bytes
}

// giveUp records that h failed with err, and whether it served damage: a
// chunk that did not verify, or damage it reported in its own store (a
// chunk marked damaged in its stream, or a refusal because its copy of
// the image does not verify).
// (Holders send their chunks unverified, and TLS guards the link: a chunk
// that does not verify here was damaged there.) A cut stream (its node
// died, the link broke) is not damage.
func (h *holder) giveUp(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		h.err = err
	}
	corrupt := errors.Is(err, image.ErrCorrupt) || errors.Is(err, store.ErrCorrupt)
	var refused *agentv1.Error
	said := errors.Is(err, store.ErrSenderDamaged) || errors.As(err, &refused) && refused.Code == agentv1.CodeCorrupt
	if said || corrupt && !errors.Is(err, io.ErrUnexpectedEOF) {
		h.damaged = true
	}
}

func (h *holder) failed() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

func (h *holder) share() agentv1.HolderShare {
	h.mu.Lock()
	defer h.mu.Unlock()
	sh := agentv1.HolderShare{Node: h.Node, Chunks: h.chunks, Bytes: h.bytes, Damaged: h.damaged}
	if h.err != nil {
		sh.Error = h.err.Error()
	}
	return sh
}

// shareQueue hands out the shares of a chunk list to the streams of a
// fetch. A share a stream could not finish goes back to the front, for
// the next stream that asks.
type shareQueue struct {
	mu       sync.Mutex
	cond     *sync.Cond
	shares   [][]store.ID
	inFlight int
}

func newShareQueue(ids []store.ID, size int) *shareQueue {
	q := &shareQueue{}
	q.cond = sync.NewCond(&q.mu)
	for len(ids) > 0 {
		n := min(size, len(ids))
		q.shares = append(q.shares, ids[:n:n])
		ids = ids[n:]
	}
	return q
}

// next returns the next share, waiting while the queue is empty but
// shares are in flight (one may come back); false when everything is
// done.
func (q *shareQueue) next() ([]store.ID, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.shares) == 0 && q.inFlight > 0 {
		q.cond.Wait()
	}
	if len(q.shares) == 0 {
		return nil, false
	}
	s := q.shares[0]
	q.shares = q.shares[1:]
	q.inFlight++
	return s, true
}

// done ends a share handed out by next; rest is what of it did not
// arrive, which goes back to the front of the queue.
func (q *shareQueue) done(rest []store.ID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(rest) > 0 {
		q.shares = append([][]store.ID{rest}, q.shares...)
	}
	q.inFlight--
	q.cond.Broadcast()
}

// left counts the chunks no stream fetched.
func (q *shareQueue) left() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, s := range q.shares {
		n += len(s)
	}
	return n
}
