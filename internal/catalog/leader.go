package catalog

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// electionPrefix is where candidates for leadership queue, each under a
// key of its session's lease; the oldest key leads.
const electionPrefix = Root + "leader/"

// Candidate is one process that may lead: a session whose lease it keeps
// alive, and its place in the election. A Candidate whose process stops
// (dies, pauses, loses etcd) stops keeping its lease alive; the lease
// ends after its TTL, and with it the leadership and everything attached
// to the session (Announce).
type Candidate struct {
	c        *Catalog
	session  *concurrency.Session
	election *concurrency.Election
}

// Candidate opens a session of ttl (whole seconds, at least etcd's
// minimum) to campaign with.
func (c *Catalog) Candidate(ctx context.Context, ttl time.Duration) (*Candidate, error) {
	secs := int((ttl + time.Second - 1) / time.Second)
	if secs < 1 {
		return nil, fmt.Errorf("candidate: ttl %v is not positive", ttl)
	}
	s, err := concurrency.NewSession(c.cli, concurrency.WithTTL(secs), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("candidate: %w", err)
	}
	return &Candidate{c: c, session: s, election: concurrency.NewElection(s, electionPrefix)}, nil
}

// Announce writes v as JSON at key for as long as the candidate's session
// lives: it goes with the session's lease.
func (cd *Candidate) Announce(ctx context.Context, key string, v any) error {
	if err := checkKey(key); err != nil {
		return err
	}
	val, err := encode(key, v)
	if err != nil {
		return err
	}
	if _, err := cd.c.cli.Put(ctx, Root+key, val, clientv3.WithLease(cd.session.Lease())); err != nil {
		return fmt.Errorf("announce %s: %w", key, err)
	}
	return nil
}

// Campaign waits until the candidate leads, and returns the key and its
// creation revision that stand for this leadership: pass them to Fence.
// It returns ctx's error if ctx ends first, and ErrDeposed if the
// session ends first.
func (cd *Candidate) Campaign(ctx context.Context, val string) (key string, rev int64, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-cd.session.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := cd.election.Campaign(ctx, val); err != nil {
		select {
		case <-cd.session.Done():
			return "", 0, fmt.Errorf("campaign: session ended: %w", ErrDeposed)
		default:
		}
		return "", 0, fmt.Errorf("campaign: %w", err)
	}
	return cd.election.Key(), cd.election.Rev(), nil
}

// Done is closed once the candidate's session has ended: its lease
// expired or was revoked, or could not be kept alive. A leader whose
// session ended no longer leads.
func (cd *Candidate) Done() <-chan struct{} { return cd.session.Done() }

// Close resigns the leadership if the candidate holds it and ends the
// session, which lets another candidate lead at once.
func (cd *Candidate) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = cd.election.Resign(ctx)
	return cd.session.Close()
}

// Leader returns the value the current leader campaigned with, or
// ErrNotFound if none leads.
func (c *Catalog) Leader(ctx context.Context) (string, error) {
	resp, err := c.cli.Get(ctx, electionPrefix, clientv3.WithFirstCreate()...)
	if err != nil {
		return "", fmt.Errorf("leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return "", fmt.Errorf("leader: %w", ErrNotFound)
	}
	return string(resp.Kvs[0].Value), nil
}
