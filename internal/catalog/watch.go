package catalog

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrCompacted is the Err of a watch's last event when the revision it was
// to start after has been compacted away: List again and watch from there.
var ErrCompacted = errors.New("revision compacted")

// EventKind says what happened to a key.
type EventKind int

const (
	// EventPut is a write of a key, new or not.
	EventPut EventKind = iota + 1
	// EventDelete is a removal of a key, by Delete, a Txn or a lease's
	// end.
	EventDelete
)

func (k EventKind) String() string {
	switch k {
	case EventPut:
		return "put"
	case EventDelete:
		return "delete"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one change seen by Watch.
type Event struct {
	Kind  EventKind
	Key   string // relative to Root
	Value []byte // the new raw JSON value; nil for EventDelete
	Rev   int64  // the revision of the change

	// Err is set on the last event of a watch that ended for a reason
	// other than its context ending or the Catalog closing: ErrCompacted,
	// or the error etcd gave. Kind, Key, Value and Rev are then zero.
	Err error
}

// Watch returns the changes to keys that start with prefix, in revision
// order, from the revision after afterRev, typically the one List returned,
// or from now if afterRev is 0. The channel is closed when ctx ends or the
// Catalog is closed, or after an event with Err set. While etcd cannot be
// reached the watch waits, and resumes where it was when etcd is back.
// Events wait for the receiver: a receiver that stops reading holds the
// watch until ctx ends.
func (c *Catalog) Watch(ctx context.Context, prefix string, afterRev int64) <-chan Event {
	out := make(chan Event)
	if err := checkPrefix(prefix); err != nil {
		go c.send(ctx, out, Event{Err: err}, true)
		return out
	}
	wctx, cancel := context.WithCancel(ctx)
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if afterRev > 0 {
		opts = append(opts, clientv3.WithRev(afterRev+1))
	}
	wch := c.cli.Watch(clientv3.WithRequireLeader(wctx), Root+prefix, opts...)
	go func() {
		defer close(out)
		defer cancel()
		for resp := range wch {
			if resp.CompactRevision != 0 {
				c.send(ctx, out, Event{Err: fmt.Errorf("watch %s after revision %d: %w", prefix, afterRev, ErrCompacted)}, false)
				return
			}
			if err := resp.Err(); err != nil {
				c.send(ctx, out, Event{Err: fmt.Errorf("watch %s: %w", prefix, err)}, false)
				return
			}
			for _, ev := range resp.Events {
				e := Event{Key: strings.TrimPrefix(string(ev.Kv.Key), Root), Rev: ev.Kv.ModRevision}
				if ev.Type == mvccpb.DELETE {
					e.Kind = EventDelete
				} else {
					e.Kind, e.Value = EventPut, ev.Kv.Value
				}
				if !c.send(ctx, out, e, false) {
					return
				}
			}
		}
		if ctx.Err() == nil {
			c.send(ctx, out, Event{Err: fmt.Errorf("watch %s: %w", prefix, errWatchEnded)}, false)
		}
	}()
	return out
}

var errWatchEnded = errors.New("watch ended")

// send delivers e on out unless ctx ends or the Catalog closes first, and
// reports whether it did. With closeOut it closes out afterwards.
func (c *Catalog) send(ctx context.Context, out chan<- Event, e Event, closeOut bool) bool {
	if closeOut {
		defer close(out)
	}
	select {
	case out <- e:
		return true
	case <-ctx.Done():
	case <-c.done:
	}
	return false
}
