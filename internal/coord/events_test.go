package coord_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/events"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// stallConn is a connection whose reads stop for good once stall is
// closed (until done is), as those of a process that was suspended.
type stallConn struct {
	net.Conn
	stall, done <-chan struct{}
}

func (c *stallConn) Read(b []byte) (int, error) {
	select {
	case <-c.stall:
		<-c.done
		return 0, net.ErrClosed
	default:
		return c.Conn.Read(b)
	}
}

// follow opens the coordinator's event stream with follow, as `cairn
// events --follow` does, and reads nothing of it.
func follow(t *testing.T, tc *testCoord) {
	t.Helper()
	c := rpc.NewCoordClient(tc.addr, issue(t, tc.ca, "cli", pki.Client))
	ctx, cancel := context.WithCancel(context.Background())
	body, err := c.Events(ctx, rpc.EventsQuery{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		body.Close()
		c.Close()
	})
}

// followAndStall opens the coordinator's event stream with follow and
// then reads nothing at all of its connection, as a process that was
// suspended.
func followAndStall(t *testing.T, tc *testCoord) {
	t.Helper()
	stalled, done := make(chan struct{}), make(chan struct{})
	tr := &http.Transport{
		TLSClientConfig:   pki.ClientConfig(issue(t, tc.ca, "cli", pki.Client), rpc.CoordServerName),
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			if err := c.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
				return nil, err
			}
			return &stallConn{Conn: c, stall: stalled, done: done}, nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+tc.addr+coordv1.PathEvents+"?follow=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(done)
		cancel()
		resp.Body.Close()
		tr.CloseIdleConnections()
	})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET events: %s", resp.Status)
	}
	t.Logf("following over %s", resp.Proto)
	close(stalled)
}

// TestFollowerThatDoesNotRead: a follower of the event stream that stops
// taking events, whether its connection still flows or not, is cut off
// about WriteTimeout after it stops, before it has fallen far enough
// behind for the exchange to drop it, and nothing of what is published
// after that is kept for it.
func TestFollowerThatDoesNotRead(t *testing.T) {
	const writeTimeout = time.Second
	for _, tc := range []struct {
		name   string
		follow func(*testing.T, *testCoord)
	}{
		{"reading nothing of the stream", follow},
		{"reading nothing of the connection", followAndStall},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := events.New(events.Options{Keep: 100})
			if err != nil {
				t.Fatal(err)
			}
			defer x.Close()
			co := startCoordinator(t, coord.Options{Events: x, WriteTimeout: writeTimeout})
			tc.follow(t, co)
			waitSubscribers(t, x, 1, 5*time.Second)

			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			pad := strings.Repeat("x", 4<<10)
			publish := func(n int) {
				for i := range n {
					x.Publish(evv1.Event{Type: evv1.NodeJoined, Message: fmt.Sprint(i, pad)})
				}
			}
			// 12 MiB, more than the flow control window and the sockets'
			// buffers hold, in fewer events than the subscription's buffer.
			start := time.Now()
			publish(3000)
			if !waitSubscribers(t, x, 0, writeTimeout+5*time.Second) {
				t.Errorf("a follower that reads nothing is still subscribed %v later", time.Since(start).Round(time.Millisecond))
			} else {
				t.Logf("cut off %v after the events were published", time.Since(start).Round(time.Millisecond))
			}
			publish(20000) // 80 MiB more
			runtime.GC()
			runtime.ReadMemStats(&after)
			if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 8<<20 {
				t.Errorf("heap grew by %d MiB while a follower did not read", grew>>20)
			}
		})
	}
}

// waitSubscribers waits up to within for x to have n subscribers and
// reports whether it did.
func waitSubscribers(t *testing.T, x *events.Exchange, n int, within time.Duration) bool {
	t.Helper()
	for deadline := time.Now().Add(within); x.Subscribers() != n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// TestFollowerIdleStays: a follower that reads everything stays connected
// through quiet times longer than WriteTimeout.
func TestFollowerIdleStays(t *testing.T) {
	const writeTimeout = 500 * time.Millisecond
	x, err := events.New(events.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	tc := startCoordinator(t, coord.Options{Events: x, WriteTimeout: writeTimeout})
	c := rpc.NewCoordClient(tc.addr, issue(t, tc.ca, "cli", pki.Client))
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body, err := c.Events(ctx, rpc.EventsQuery{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for i := range 3 {
		if i > 0 {
			time.Sleep(3 * writeTimeout)
		}
		x.Publish(evv1.Event{Type: evv1.NodeJoined, Node: fmt.Sprint("n", i)})
		select {
		case l, ok := <-lines:
			if !ok || !strings.Contains(l, fmt.Sprintf(`"node":"n%d"`, i)) {
				t.Fatalf("event %d after a quiet time: %q, stream open %v", i, l, ok)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d not delivered within 5s", i)
		}
	}
}
