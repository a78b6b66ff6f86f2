package catalog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// AlivePrefix is the prefix of membership keys: alive/NAME exists while
// NAME's lease lives.
const AlivePrefix = "alive/"

// ErrLeaseExpired is returned by KeepAlive when the membership's lease is
// gone, expired or revoked: the member has been reported lost and must
// Register again.
var ErrLeaseExpired = errors.New("lease expired")

// Membership is a member's registration: the key alive/NAME attached to a
// lease that the member must refresh with KeepAlive more often than its
// TTL.
type Membership struct {
	c     *Catalog
	name  string
	lease clientv3.LeaseID
	ttl   time.Duration
}

// Register grants a fresh lease of ttl (rounded up to whole seconds; etcd
// may raise it to its minimum) and attaches the key alive/NAME to it. A
// name already registered is taken over: its key moves to the new lease,
// so the old lease's end no longer removes it. name must not contain '/'.
func (c *Catalog) Register(ctx context.Context, name string, ttl time.Duration) (*Membership, error) {
	if name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("register %q: invalid member name", name)
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	if secs < 1 {
		return nil, fmt.Errorf("register %s: ttl %v is not positive", name, ttl)
	}
	g, err := c.cli.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("register %s: grant lease: %w", name, err)
	}
	if _, err := c.guarded(ctx, "register "+name, clientv3.OpPut(Root+AlivePrefix+name, "", clientv3.WithLease(g.ID))); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_, _ = c.cli.Revoke(rctx, g.ID)
		return nil, err
	}
	c.wrote(Root+AlivePrefix+name, "")
	return &Membership{c: c, name: name, lease: g.ID, ttl: time.Duration(g.TTL) * time.Second}, nil
}

// Name returns the member's name.
func (m *Membership) Name() string { return m.name }

// TTL returns the lease's TTL as granted.
func (m *Membership) TTL() time.Duration { return m.ttl }

// Lease returns the lease's ID, to attach other keys to the member's life
// through Client.
func (m *Membership) Lease() clientv3.LeaseID { return m.lease }

// KeepAlive refreshes the lease once, restarting its TTL. It returns
// ErrLeaseExpired if the lease is gone.
func (m *Membership) KeepAlive(ctx context.Context) error {
	_, err := m.c.cli.KeepAliveOnce(ctx, m.lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("keep %s alive: %w", m.name, ErrLeaseExpired)
	}
	if err != nil {
		return fmt.Errorf("keep %s alive: %w", m.name, err)
	}
	return nil
}

// Revoke ends the lease now, which removes alive/NAME (unless another
// registration took it over) and reports the member lost at once. Revoking
// a lease that has already expired is not an error.
func (m *Membership) Revoke(ctx context.Context) error {
	_, err := m.c.cli.Revoke(ctx, m.lease)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke %s: %w", m.name, err)
	}
	return nil
}

// Alive returns the names of the members registered now, each mapped to
// true.
func (c *Catalog) Alive(ctx context.Context) (map[string]bool, error) {
	alive := make(map[string]bool)
	_, err := c.List(ctx, AlivePrefix, func(key string, _ []byte) error {
		alive[strings.TrimPrefix(key, AlivePrefix)] = true
		return nil
	})
	return alive, err
}

// MemberChange says what happened to a member.
type MemberChange int

const (
	// MemberJoined: the member registered, or registered again.
	MemberJoined MemberChange = iota + 1
	// MemberLost: its lease expired or was revoked.
	MemberLost
)

func (k MemberChange) String() string {
	switch k {
	case MemberJoined:
		return "joined"
	case MemberLost:
		return "lost"
	}
	return fmt.Sprintf("MemberChange(%d)", int(k))
}

// MemberEvent is one change seen by WatchAlive.
type MemberEvent struct {
	Change MemberChange
	Name   string
	Rev    int64

	// Err is set on the last event of a watch that ended for a reason
	// other than its context ending or the Catalog closing.
	Err error
}

// WatchAlive first reports every member alive now as MemberJoined, then
// every change after that, with no gap between the two. The channel is
// closed as Watch's is.
func (c *Catalog) WatchAlive(ctx context.Context) <-chan MemberEvent {
	out := make(chan MemberEvent)
	go func() {
		defer close(out)
		send := func(e MemberEvent) bool {
			select {
			case out <- e:
				return true
			case <-ctx.Done():
			case <-c.done:
			}
			return false
		}
		var now []string
		rev, err := c.List(ctx, AlivePrefix, func(key string, _ []byte) error {
			now = append(now, strings.TrimPrefix(key, AlivePrefix))
			return nil
		})
		if err != nil {
			if ctx.Err() == nil {
				send(MemberEvent{Err: fmt.Errorf("watch members: %w", err)})
			}
			return
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		events := c.Watch(wctx, AlivePrefix, rev)
		for _, name := range now {
			if !send(MemberEvent{Change: MemberJoined, Name: name, Rev: rev}) {
				return
			}
		}
		for ev := range events {
			me := MemberEvent{Name: strings.TrimPrefix(ev.Key, AlivePrefix), Rev: ev.Rev, Err: ev.Err}
			switch {
			case ev.Err != nil:
				me.Err = fmt.Errorf("watch members: %w", ev.Err)
			case ev.Kind == EventPut:
				me.Change = MemberJoined
			default:
				me.Change = MemberLost
			}
			if !send(me) {
				return
			}
		}
	}()
	return out
}
