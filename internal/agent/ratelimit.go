package agent

import (
	"context"
	"io"
	"time"
)

// rateReader limits how fast r is read to rate bytes per second on
// average, so that replication leaves the network to the job: a transfer
// sleeps whenever it is ahead of its budget, measured from its start (no
// burst beyond 64 KiB builds up while the reader waits for data).
type rateReader struct {
	ctx   context.Context
	r     io.Reader
	rate  int64 // bytes per second; <= 0 means no limit
	start time.Time
	n     int64
}

func newRateReader(ctx context.Context, r io.Reader, rate int64) io.Reader {
	if rate <= 0 {
		return r
	}
	return &rateReader{ctx: ctx, r: r, rate: rate, start: time.Now()}
}

func (l *rateReader) Read(p []byte) (int, error) {
	if len(p) > 64<<10 {
		p = p[:64<<10]
	}
	n, err := l.r.Read(p)
	l.n += int64(n)
	due := l.start.Add(time.Duration(float64(l.n) / float64(l.rate) * float64(time.Second)))
	if wait := time.Until(due); wait > 0 {
		select {
		case <-l.ctx.Done():
			return n, l.ctx.Err()
		case <-time.After(wait):
		}
	}
	// Time spent waiting for data is not saved up for a burst later.
	if behind := time.Since(due); behind > time.Second {
		l.start = l.start.Add(behind - time.Second)
	}
	return n, err
}
