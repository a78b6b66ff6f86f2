package rpc

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
)

// FailoverWait bounds how long a call to the coordinators keeps trying
// while none of them leads (one stands by, another cannot be reached):
// long enough for a standby to take over from a leader that died.
var FailoverWait = 20 * time.Second

// failover calls one of several servers that stand for one service, of
// which one at a time answers (the leading coordinator). It starts with
// the one that answered last and moves on to the next when a server
// answers that it does not lead, or cannot be reached before the request
// is sent; a GET also moves on when the connection fails later, since
// sending it again changes nothing. Any other answer is the call's. A
// request that may have reached a server that then failed is not sent
// again: what it did is unknown, and the caller must look; but the next
// call starts with the next server, so that a leader that stopped
// answering (paused, cut off) is not asked first forever.
type failover struct {
	clients []*Client
	cur     atomic.Int32 // the index of the one that answered last
	wait    time.Duration
}

func (f *failover) Close() {
	for _, c := range f.clients {
		c.Close()
	}
}

// Do is Client.Do on the leading server.
func (f *failover) Do(ctx context.Context, method, path string, body, out any) error {
	return f.try(ctx, method, func(c *Client) error { return c.Do(ctx, method, path, body, out) })
}

// Stream is Client.Stream on the leading server.
func (f *failover) Stream(ctx context.Context, path string, body any) (io.ReadCloser, error) {
	var rc io.ReadCloser
	method := http.MethodGet
	if body != nil {
		method = http.MethodPost
	}
	err := f.try(ctx, method, func(c *Client) error {
		var err error
		rc, err = c.Stream(ctx, path, body)
		return err
	})
	return rc, err
}

// try calls call on each server in turn, from the last that answered,
// until one answers, and goes round again, a little later each time,
// while none leads and f.wait has not passed.
func (f *failover) try(ctx context.Context, method string, call func(*Client) error) error {
	n := int32(len(f.clients))
	deadline := time.Now().Add(f.wait)
	pause := 100 * time.Millisecond
	for {
		first := f.cur.Load()
		var err error
		for i := range n {
			k := (first + i) % n
			if err = call(f.clients[k]); !moveOn(method, err) {
				if unanswered(err) {
					k = (k + 1) % n
				}
				f.cur.Store(k)
				return err
			}
		}
		if n == 1 && !notLeader(err) || time.Now().Add(pause).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// moveOn reports whether err lets a call go to the next server: that
// server does not lead, or was not reached (or, for a GET, failed).
func moveOn(method string, err error) bool {
	if err == nil {
		return false
	}
	if notLeader(err) {
		return true
	}
	var ae *agentv1.Error
	if errors.As(err, &ae) {
		return false // an answer
	}
	if method == http.MethodGet {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED) ||
		strings.Contains(err.Error(), "TLS handshake timeout")
}

// unanswered reports whether err is no answer of the server's.
func unanswered(err error) bool {
	var ae *agentv1.Error
	return err != nil && !errors.As(err, &ae)
}

func notLeader(err error) bool {
	var ae *agentv1.Error
	return errors.As(err, &ae) && ae.Code == coordv1.CodeNotLeader
}
