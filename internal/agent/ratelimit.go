package agent

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// rateReader limits how fast r is read to rate bytes per second on
// average, so that replication leaves the network to the job: a transfer
// sleeps whenever it is ahead of its budget, measured from its start (no
// burst beyond 64 KiB builds up while the reader waits for data).
type rateReader struct {
	ctx context.Context
	r   io.Reader
	l   *rateLimit
}

// rateLimit is the budget several readers share: the streams of one fetch
// from several holders together keep to the fetch's rate.
type rateLimit struct {
	rate  atomic.Int64 // bytes per second; <= 0 means no limit
	mu    sync.Mutex
	start time.Time
	n     int64
}

func newRateLimit(rate int64) *rateLimit {
	l := &rateLimit{start: time.Now()}
	l.rate.Store(rate)
	return l
}

// lift ends the limit, for the readers already made too.
func (l *rateLimit) lift() { l.rate.Store(0) }

func newRateReader(ctx context.Context, r io.Reader, rate int64) io.Reader {
	return newRateLimit(rate).reader(ctx, r)
}

// reader returns r limited by l's budget.
func (l *rateLimit) reader(ctx context.Context, r io.Reader) io.Reader {
	if l.rate.Load() <= 0 {
		return r
	}
	return &rateReader{ctx: ctx, r: r, l: l}
}

func (r *rateReader) Read(p []byte) (int, error) {
	if len(p) > 64<<10 {
		p = p[:64<<10]
	}
	n, err := r.r.Read(p)
	if r.l.rate.Load() <= 0 {
		return n, err
	}
	wait := r.l.take(n)
	if wait > 0 {
		select {
		case <-r.ctx.Done():
			return n, r.ctx.Err()
		case <-time.After(wait):
		}
	}
	return n, err
}

// take counts n bytes read and returns how long to wait to keep to the
// rate.
func (l *rateLimit) take(n int) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n += int64(n)
	rate := l.rate.Load()
	if rate <= 0 {
		return 0
	}
	due := l.start.Add(time.Duration(float64(l.n) / float64(rate) * float64(time.Second)))
	// Time spent waiting for data is not saved up for a burst later.
	if behind := time.Since(due); behind > time.Second {
		l.start = l.start.Add(behind - time.Second)
	}
	return time.Until(due)
}
