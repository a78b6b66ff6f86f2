// The agent's side of a global checkpoint's two-phase commit, and the
// holds of a migration's ranks.

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
)

// Defaults of the holds.
var (
	// DefaultHold is how long a prepared or stalled rank waits for the
	// coordinator when the request names no hold.
	DefaultHold = 30 * time.Second
	// PendingTTL is how long a prepared image is kept after its rank was
	// thawed for want of a decision: a coordinator that comes back within
	// it can still commit the round.
	PendingTTL = 10 * time.Minute
)

// rankOps are the operations on this node's ranks that the participant
// asks for. managerRanks does them with the node's container.Manager and
// the ranks' network namespaces.
type rankOps interface {
	// AwaitMemory waits, for at most within, until every page of the
	// rank's lazy restore, if one is going on, has arrived, and returns
	// how long it waited; an error says the rank cannot be dumped yet
	// (container.AwaitMemory).
	AwaitMemory(ctx context.Context, name string, within time.Duration) (time.Duration, error)
	// Prepare locks the rank's network, then freezes the rank and dumps
	// it into staging as checkpoint seq, and leaves it so. On error the
	// rank runs on and its network is unlocked.
	Prepare(ctx context.Context, name string, seq int) (stagedRank, error)
	// Stored returns the record of checkpoint name:seq in this node's
	// store, or an error wrapping image.ErrNotFound.
	Stored(name string, seq int) (*image.Record, error)
	// Lock locks the rank's network (nothing for a rank without a job
	// network); Freeze freezes the rank. Together they stall it.
	Lock(ctx context.Context, name string) error
	Freeze(ctx context.Context, name string) error
	// Resume unlocks the rank's network and thaws it (a stall's end, or
	// a restored rank's start).
	Resume(ctx context.Context, name string) error
	// Decided tells that checkpoint seq of the rank is committed (or
	// aborted), before the rank is thawed for it: the rank learns it the
	// moment it runs again (the rank API).
	Decided(name string, seq int, committed bool)
	// EndAtCheckpoint ends a rank that a checkpoint with stop was
	// committed for, if it still runs (container.EndAtCheckpoint).
	EndAtCheckpoint(ctx context.Context, name string) error
}

// stagedRank is a rank prepared by rankOps.Prepare: frozen, its network
// locked, its image in staging. Commit or Abort ends it.
type stagedRank interface {
	// Thaw unlocks the rank's network and thaws the rank; the image
	// stays. The participant calls it at most once.
	Thaw(ctx context.Context) error
	// Stop ends the rank without thawing it (container.Prepared.Stop);
	// its network stays locked and the image stays, for Commit. The
	// participant calls it at most once, instead of Thaw.
	Stop(ctx context.Context) error
	// Commit stores the image as the checkpoint; Abort drops it. Both
	// thaw the rank first if it is still frozen, but leave its network
	// as it is.
	Commit(ctx context.Context) (*image.Record, error)
	Abort(ctx context.Context) error
	// Size is the staged image's size, CRIUTime the time CRIU took to
	// dump the rank.
	Size() int64
	CRIUTime() time.Duration
	// ImageDir and Record are the staged image and the record it gets
	// once stored (a migration streams them to the target node).
	ImageDir() string
	Record() image.Record
}

// ckptKey names one rank's part of a checkpoint.
type ckptKey struct {
	rank string // the rank's container (agentv1.RankName)
	ckpt int    // the checkpoint's number
}

// participant is the agent's side of the coordinator's protocols: the
// ranks it prepared for a global checkpoint, held until the decision, and
// the ranks that wait for RankResume during a migration.
//
// A rank's part of a checkpoint goes through these states:
//
//   - preparing: Prepare runs (lock, freeze, dump). A second prepare of
//     it is refused (exists); an abort is remembered, and the prepare
//     gives its rank up as soon as the dump ends (no-such-round).
//   - prepared: frozen, its network locked, its image staged, waiting for
//     the decision until its hold ends. A second prepare is refused.
//   - thawed: the hold ended without a decision; the rank runs again but
//     its image is kept for PendingTTL, for a commit that may still come.
//   - committing: the image is being stored; a commit sent again waits
//     for it, then answers from the store.
//   - gone: committed (a commit answers from the store), aborted, expired
//     (PendingTTL after the hold: aborted), moved away (migrateOut: the
//     image dropped, the network left locked) or dropped with its rank.
//     An abort of a rank part that is not there is remembered: a prepare
//     of it yet to come gives its rank up as soon as its dump ends. A
//     commit of one the store lacks is refused (no-such-round).
//
// A rank held for a migration is stalled (locked and frozen) or migrated
// in, until release; if its hold ends first, what hold was given runs
// (a stalled rank resumes, a migrated-in one is removed).
type participant struct {
	ops rankOps
	log *slog.Logger

	mu sync.Mutex
	// preparing are the prepares in progress; each channel is closed
	// when its prepare ends.
	preparing map[ckptKey]chan struct{}
	// prepared are the prepared (or thawed) ranks waiting for the
	// decision.
	prepared map[ckptKey]*prepared
	// committing are the commits in progress, so that a commit sent
	// again (by a coordinator that restarted) waits for the first.
	committing map[ckptKey]chan struct{}
	// aborted are aborts that found nothing prepared, with when they
	// came: a prepare still running (or yet to come) gives its rank up
	// as soon as its dump ends, instead of holding it frozen until the
	// hold ends.
	aborted map[ckptKey]time.Time
	// held are the ranks waiting for RankResume, by container, each with
	// the timer that ends its hold.
	held map[string]*time.Timer
}

func newParticipant(ops rankOps, log *slog.Logger) *participant {
	return &participant{
		ops:        ops,
		log:        log,
		preparing:  map[ckptKey]chan struct{}{},
		prepared:   map[ckptKey]*prepared{},
		committing: map[ckptKey]chan struct{}{},
		aborted:    map[ckptKey]time.Time{},
		held:       map[string]*time.Timer{},
	}
}

// prepared is a rank waiting for the decision.
type prepared struct {
	staged stagedRank
	hold   *time.Timer // thaws the rank when the hold ends
	expire *time.Timer // aborts the prepare when nobody ever decides
	mu     sync.Mutex  // serializes the decision and the timers
	// thawed: the rank was thawed and its network unlocked, or must not
	// be (it moved away).
	thawed bool
}

// holdOr is hold, or DefaultHold if the request named none.
func holdOr(hold time.Duration) time.Duration {
	if hold <= 0 {
		return DefaultHold
	}
	return hold
}

// prepare prepares a rank for checkpoint key.ckpt and keeps it frozen,
// its network locked, until commit, abort or the end of the hold. A rank
// still receiving the memory of a lazy restore is waited for first, for
// at most memoryWait, while it runs.
func (p *participant) prepare(ctx context.Context, key ckptKey, hold, memoryWait time.Duration) (agentv1.Prepared, error) {
	p.mu.Lock()
	if _, ok := p.prepared[key]; ok {
		p.mu.Unlock()
		return agentv1.Prepared{}, fmt.Errorf("%w: %s:%d is already prepared", container.ErrExists, key.rank, key.ckpt)
	}
	if _, ok := p.preparing[key]; ok {
		p.mu.Unlock()
		return agentv1.Prepared{}, fmt.Errorf("%w: %s:%d is being prepared", container.ErrExists, key.rank, key.ckpt)
	}
	ended := make(chan struct{})
	p.preparing[key] = ended
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.preparing, key)
		p.mu.Unlock()
		close(ended)
	}()
	start := time.Now()
	waited, err := p.ops.AwaitMemory(ctx, key.rank, memoryWait)
	if err != nil {
		return agentv1.Prepared{}, err
	}
	if waited > 0 {
		p.log.Info("prepare waited for the memory of a lazy restore", "rank", key.rank, "ckpt", key.ckpt, "waited", waited)
	}
	st, err := p.ops.Prepare(ctx, key.rank, key.ckpt)
	if err != nil {
		return agentv1.Prepared{}, err
	}
	hold = holdOr(hold)
	r := &prepared{staged: st}
	r.hold = time.AfterFunc(hold, func() { p.holdEnded(key, r, hold) })
	r.expire = time.AfterFunc(hold+PendingTTL, func() { p.expired(key) })
	// An abort that came while the rank dumped was remembered: checking
	// for it and publishing the prepare happen under one lock, so that
	// every abort either finds the prepare or is found by it.
	p.mu.Lock()
	_, abortedMeanwhile := p.aborted[key]
	delete(p.aborted, key)
	if !abortedMeanwhile {
		p.prepared[key] = r
	}
	p.mu.Unlock()
	if abortedMeanwhile {
		r.stopTimers()
		ctx := context.WithoutCancel(ctx)
		err := errors.Join(r.thaw(ctx), st.Abort(ctx))
		return agentv1.Prepared{}, errors.Join(&agentv1.Error{Code: agentv1.CodeNoSuchRound, Message: fmt.Sprintf("%s:%d was aborted while it prepared", key.rank, key.ckpt)}, err)
	}
	return agentv1.Prepared{Size: st.Size(), Dump: time.Since(start), CRIU: st.CRIUTime(), MemoryWait: waited}, nil
}

// commit thaws a prepared rank (unless its hold did) and stores its image.
// A commit of an image already in the store (a commit sent again)
// succeeds. A thaw that failed is reported with the committed
// checkpoint.
func (p *participant) commit(ctx context.Context, key ckptKey) (*agentv1.Committed, error) {
	return p.decideCommit(ctx, key, false)
}

// commitAndStop ends a prepared rank at its checkpoint instead of thawing
// it (stagedRank.Stop), then stores its image. The rank is ended even when
// there is nothing prepared to commit (a commit sent again, or one that
// came after this agent restarted) or the store fails: the job is stopped
// at this checkpoint whatever becomes of this rank's image.
func (p *participant) commitAndStop(ctx context.Context, key ckptKey) (*agentv1.Committed, error) {
	return p.decideCommit(ctx, key, true)
}

func (p *participant) decideCommit(ctx context.Context, key ckptKey, stop bool) (*agentv1.Committed, error) {
	ctx = context.WithoutCancel(ctx)
	p.mu.Lock()
	r := p.take(key)
	if r == nil {
		wait := p.committing[key]
		p.mu.Unlock()
		if wait != nil {
			<-wait
		}
		if stop {
			if err := p.ops.EndAtCheckpoint(ctx, key.rank); err != nil && !errors.Is(err, container.ErrNotFound) {
				p.log.Error("end a rank at its checkpoint", "rank", key.rank, "ckpt", key.ckpt, "err", err)
			}
		}
		if rec, err := p.ops.Stored(key.rank, key.ckpt); err == nil {
			return &agentv1.Committed{Checkpoint: checkpointWire(rec)}, nil
		}
		return nil, &agentv1.Error{Code: agentv1.CodeNoSuchRound, Message: fmt.Sprintf("%s:%d is not prepared on this node", key.rank, key.ckpt)}
	}
	done := make(chan struct{})
	p.committing[key] = done
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.committing, key)
		p.mu.Unlock()
		close(done)
	}()
	r.stopTimers()
	r.mu.Lock()
	defer r.mu.Unlock()
	p.ops.Decided(key.rank, key.ckpt, true)
	var thawErr error
	if stop {
		// A rank that could not be ended is reported, not its commit
		// failed: its image is as good, and the coordinator kills what
		// is left of a stopped job.
		r.thawed = true // and never will be: ended, its network locked
		if err := r.staged.Stop(ctx); err != nil {
			p.log.Error("end a rank at its checkpoint", "rank", key.rank, "ckpt", key.ckpt, "err", err)
		}
	} else {
		thawErr = r.thawLocked(ctx)
	}
	rec, err := r.staged.Commit(ctx)
	if err != nil {
		return nil, errors.Join(err, thawErr)
	}
	return &agentv1.Committed{Checkpoint: checkpointWire(rec), Stall: rec.Timing.Stall}, thawErr
}

// abort thaws a prepared rank (unless its hold did) and drops its image.
// With nothing prepared, the abort is remembered for a prepare still
// running (it is waited for: the rank runs again when abort returns) or
// yet to come.
func (p *participant) abort(ctx context.Context, key ckptKey) error {
	ctx = context.WithoutCancel(ctx)
	p.mu.Lock()
	r := p.take(key)
	if r == nil {
		now := time.Now()
		for k, at := range p.aborted {
			if now.Sub(at) > PendingTTL {
				delete(p.aborted, k)
			}
		}
		p.aborted[key] = now
		ended := p.preparing[key]
		p.mu.Unlock()
		if ended != nil {
			<-ended
		}
		return nil
	}
	p.mu.Unlock()
	r.stopTimers()
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.thawLocked(ctx), r.staged.Abort(ctx))
}

// migrateOut drops the prepare of a rank that moved to another node
// without unlocking its network: the rank runs again only to be removed,
// and cannot send a packet meanwhile.
func (p *participant) migrateOut(ctx context.Context, key ckptKey) error {
	p.mu.Lock()
	r := p.take(key)
	p.mu.Unlock()
	if r == nil {
		return nil
	}
	r.stopTimers()
	r.mu.Lock()
	r.thawed = true // its network stays locked
	r.mu.Unlock()
	return r.staged.Abort(context.WithoutCancel(ctx))
}

// dropRank aborts every prepare of a rank (removed, or restored anew)
// and disarms its hold: a stall's end must not resume, nor a migrated-in
// rank's end remove, the rank restored in its place.
func (p *participant) dropRank(ctx context.Context, rank string) {
	p.release(rank)
	p.mu.Lock()
	var keys []ckptKey
	for k := range p.prepared {
		if k.rank == rank {
			keys = append(keys, k)
		}
	}
	p.mu.Unlock()
	for _, k := range keys {
		_ = p.abort(ctx, k)
	}
}

// staged returns the prepared rank of key, nil if there is none.
func (p *participant) staged(key ckptKey) stagedRank {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.prepared[key]; r != nil {
		return r.staged
	}
	return nil
}

// take removes and returns the prepared rank of key; p.mu is held.
func (p *participant) take(key ckptKey) *prepared {
	r := p.prepared[key]
	delete(p.prepared, key)
	return r
}

// holdEnded thaws a rank that got no decision within its hold; its image
// stays until the prepare expires.
func (p *participant) holdEnded(key ckptKey, r *prepared, hold time.Duration) {
	p.log.Warn("no decision within the hold: thawing", "rank", key.rank, "ckpt", key.ckpt, "hold", hold)
	if err := r.thaw(context.Background()); err != nil {
		p.log.Error("thaw at the end of the hold", "rank", key.rank, "ckpt", key.ckpt, "err", err)
	}
}

// expired drops the image of a prepare nobody decided.
func (p *participant) expired(key ckptKey) {
	p.log.Warn("no decision: dropping the prepared image", "rank", key.rank, "ckpt", key.ckpt)
	if err := p.abort(context.Background(), key); err != nil {
		p.log.Error("drop an undecided prepare", "rank", key.rank, "ckpt", key.ckpt, "err", err)
	}
}

func (r *prepared) stopTimers() {
	r.hold.Stop()
	r.expire.Stop()
}

// thaw unlocks and thaws the rank once.
func (r *prepared) thaw(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.thawLocked(ctx)
}

func (r *prepared) thawLocked(ctx context.Context) error {
	if r.thawed {
		return nil
	}
	r.thawed = true
	return r.staged.Thaw(ctx)
}

// stall locks and freezes ranks that stay where they are while another
// rank of their job moves, each until resume or the end of its hold,
// when it resumes by itself. All or nothing: on error the ranks stalled
// so far run again.
func (p *participant) stall(ctx context.Context, ranks []string, hold time.Duration) error {
	hold = holdOr(hold)
	var stalled []string
	undo := func() { _ = p.resume(context.WithoutCancel(ctx), stalled) }
	for _, name := range ranks {
		if err := p.ops.Lock(ctx, name); err != nil {
			undo()
			return err
		}
		stalled = append(stalled, name)
		if err := p.ops.Freeze(ctx, name); err != nil {
			undo()
			return fmt.Errorf("stall %s: %w", name, err)
		}
		p.hold(name, hold, func() {
			p.log.Warn("no resume within the hold: resuming the stalled rank", "rank", name, "hold", hold)
			if err := p.resume(context.Background(), []string{name}); err != nil {
				p.log.Error("resume at the end of the hold", "rank", name, "err", err)
			}
		})
	}
	return nil
}

// resume releases ranks from their holds, unlocks their networks and
// thaws them.
func (p *participant) resume(ctx context.Context, ranks []string) error {
	var errs []error
	for _, name := range ranks {
		p.release(name)
		if err := p.ops.Resume(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// hold arms a timer for a rank that waits for RankResume: ended runs if
// none comes within d. A new hold of the rank replaces the one it had.
func (p *participant) hold(name string, d time.Duration, ended func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.held[name]; t != nil {
		t.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		p.mu.Lock()
		mine := p.held[name] == t
		if mine {
			delete(p.held, name)
		}
		p.mu.Unlock()
		if mine {
			ended()
		}
	})
	p.held[name] = t
}

// release disarms a rank's hold: RankResume came.
func (p *participant) release(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.held[name]; t != nil {
		t.Stop()
		delete(p.held, name)
	}
}
