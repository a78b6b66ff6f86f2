// The agent's side of a global checkpoint's two-phase commit: a rank
// prepared (network locked, frozen, dumped, staged) waits here for the
// coordinator's decision; its hold thaws it if the decision is slow, and
// its expiry aborts it if none ever comes.

package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	v1 "cairn/api/agent/v1"
	"cairn/internal/container"
	"cairn/internal/netw"
)

// pendingKey names a prepared rank.
type pendingKey struct {
	name string
	seq  int
}

// pending is a prepared rank waiting for Commit or Abort.
type pending struct {
	prep   *container.Prepared
	netns  string
	timer  *time.Timer // thaws the rank when the hold expires
	expire *time.Timer // aborts the prepare when nobody ever decides
	mu     sync.Mutex  // serializes commit, abort and the timers
	thawed bool
	stall  time.Duration
}

// prepare locks, freezes and dumps a rank, and keeps it so until Commit,
// Abort or the end of the hold.
func (s *Server) prepare(ctx context.Context, req v1.Prepare) (v1.Prepared, error) {
	start := time.Now()
	name := v1.RankName(req.Job, req.Rank.Rank)
	key := pendingKey{name, req.Seq}
	s.ranks.mu.Lock()
	if _, ok := s.ranks.pending[key]; ok {
		s.ranks.mu.Unlock()
		return v1.Prepared{}, fmt.Errorf("%w: %s:%d is already prepared", container.ErrExists, name, req.Seq)
	}
	if s.ranks.preparing == nil {
		s.ranks.preparing = map[pendingKey]chan struct{}{}
	}
	if _, ok := s.ranks.preparing[key]; ok {
		s.ranks.mu.Unlock()
		return v1.Prepared{}, fmt.Errorf("%w: %s:%d is being prepared", container.ErrExists, name, req.Seq)
	}
	ended := make(chan struct{})
	s.ranks.preparing[key] = ended
	s.ranks.mu.Unlock()
	defer func() {
		s.ranks.mu.Lock()
		delete(s.ranks.preparing, key)
		s.ranks.mu.Unlock()
		close(ended)
	}()
	cfg, err := s.Manager.Config(name)
	if err != nil {
		return v1.Prepared{}, err
	}
	netns := ""
	if cfg.Net != nil {
		netns = cfg.Net.Netns
		if err := netw.LockNetns(ctx, netns); err != nil {
			return v1.Prepared{}, err
		}
	}
	// The prepare belongs to the round, not to this request: a caller that
	// goes away must not cancel a dump half-way.
	prep, err := s.Manager.Prepare(context.WithoutCancel(ctx), name, req.Seq)
	if err != nil {
		if netns != "" {
			_ = netw.UnlockNetns(context.WithoutCancel(ctx), netns)
		}
		return v1.Prepared{}, err
	}
	p := &pending{prep: prep, netns: netns}
	hold := req.Hold
	if hold <= 0 {
		hold = DefaultHold
	}
	p.timer = time.AfterFunc(hold, func() {
		s.log().Warn("no decision within the hold: thawing", "rank", name, "seq", req.Seq, "hold", hold)
		p.thaw(context.Background())
	})
	p.expire = time.AfterFunc(hold+PendingTTL, func() {
		s.log().Warn("no decision: dropping the prepared image", "rank", name, "seq", req.Seq)
		s.finish(context.Background(), key, false)
	})
	// An abort that came while the rank dumped was remembered: checking for
	// it and publishing the prepare happen under one lock, so that every
	// abort either finds the prepare or is found by it.
	s.ranks.mu.Lock()
	_, abortedMeanwhile := s.ranks.aborted[key]
	delete(s.ranks.aborted, key)
	if !abortedMeanwhile {
		if s.ranks.pending == nil {
			s.ranks.pending = map[pendingKey]*pending{}
		}
		s.ranks.pending[key] = p
	}
	s.ranks.mu.Unlock()
	if abortedMeanwhile {
		p.timer.Stop()
		p.expire.Stop()
		err := errors.Join(p.thaw(context.WithoutCancel(ctx)), prep.Abort(context.WithoutCancel(ctx)))
		return v1.Prepared{}, errors.Join(&v1.Error{Code: v1.CodeNoSuchRound, Message: fmt.Sprintf("%s:%d was aborted while it prepared", name, req.Seq)}, err)
	}
	s.failpoint(ctx, "prepared")
	return v1.Prepared{Size: prep.Size(), Dump: time.Since(start), CRIU: prep.CRIUTime()}, nil
}

// Defaults of the prepare hold.
var (
	DefaultHold = 30 * time.Second
	// PendingTTL is how long a prepared image is kept after its rank was
	// thawed for want of a decision: a coordinator that comes back within
	// it can still commit the round.
	PendingTTL = 10 * time.Minute
)

// thaw unlocks and thaws the rank once.
func (p *pending) thaw(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.thawLocked(ctx)
}

func (p *pending) thawLocked(ctx context.Context) error {
	if p.thawed {
		return nil
	}
	p.thawed = true
	err := p.prep.Thaw(ctx)
	if p.netns != "" {
		err = errors.Join(err, netw.UnlockNetns(ctx, p.netns))
	}
	return err
}

func (s *Server) takePending(key pendingKey) *pending {
	s.ranks.mu.Lock()
	defer s.ranks.mu.Unlock()
	p := s.ranks.pending[key]
	delete(s.ranks.pending, key)
	return p
}

// dropPending aborts every prepare of the named container.
func (s *Server) dropPending(ctx context.Context, name string) {
	s.ranks.mu.Lock()
	var keys []pendingKey
	for k := range s.ranks.pending {
		if k.name == name {
			keys = append(keys, k)
		}
	}
	s.ranks.mu.Unlock()
	for _, k := range keys {
		_, _ = s.finish(ctx, k, false)
	}
}

// finish commits or aborts a prepared rank. A commit of a rank whose image
// is already in the store (a commit sent again) succeeds.
func (s *Server) finish(ctx context.Context, key pendingKey, commit bool) (*v1.Committed, error) {
	ctx = context.WithoutCancel(ctx)
	p := s.takePending(key)
	if p == nil {
		if !commit {
			// Nothing prepared here (yet): if a prepare is still running,
			// it must not keep its rank once it ends.
			s.ranks.mu.Lock()
			if s.ranks.aborted == nil {
				s.ranks.aborted = map[pendingKey]time.Time{}
			}
			for k, at := range s.ranks.aborted {
				if time.Since(at) > PendingTTL {
					delete(s.ranks.aborted, k)
				}
			}
			s.ranks.aborted[key] = time.Now()
			ended := s.ranks.preparing[key]
			s.ranks.mu.Unlock()
			if ended != nil {
				// Answer once the rank runs again: an aborted round means
				// its ranks go on.
				<-ended
			}
			return nil, nil
		}
		s.ranks.mu.Lock()
		wait := s.ranks.committing[key]
		s.ranks.mu.Unlock()
		if wait != nil {
			<-wait
		}
		if rec, err := s.Manager.Repo().Load(key.name, key.seq); err == nil {
			return &v1.Committed{Checkpoint: checkpointWire(rec)}, nil
		}
		return nil, &v1.Error{Code: v1.CodeNoSuchRound, Message: fmt.Sprintf("%s:%d is not prepared on this node", key.name, key.seq)}
	}
	p.timer.Stop()
	p.expire.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	thawErr := p.thawLocked(ctx)
	if !commit {
		return nil, errors.Join(thawErr, p.prep.Abort(ctx))
	}
	done := make(chan struct{})
	s.ranks.mu.Lock()
	if s.ranks.committing == nil {
		s.ranks.committing = map[pendingKey]chan struct{}{}
	}
	s.ranks.committing[key] = done
	s.ranks.mu.Unlock()
	defer func() {
		s.ranks.mu.Lock()
		delete(s.ranks.committing, key)
		s.ranks.mu.Unlock()
		close(done)
	}()
	rec, err := p.prep.Commit(ctx, nil)
	if err != nil {
		return nil, errors.Join(err, thawErr)
	}
	return &v1.Committed{Checkpoint: checkpointWire(rec), Stall: rec.Timing.Stall}, thawErr
}
