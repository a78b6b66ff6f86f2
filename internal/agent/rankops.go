package agent

import (
	"context"
	"errors"
	"time"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/netw"
)

// managerRanks are the participant's rankOps on this node's Manager and
// the ranks' network namespaces, with their rank APIs (eps).
type managerRanks struct {
	m   *container.Manager
	eps *endpoints
}

var _ rankOps = managerRanks{}

func (r managerRanks) AwaitMemory(ctx context.Context, name string, within time.Duration) (time.Duration, error) {
	return r.m.AwaitMemory(ctx, name, within)
}

func (r managerRanks) Prepare(ctx context.Context, name string, seq int) (_ stagedRank, err error) {
	cfg, err := r.m.Config(name)
	if err != nil {
		return nil, err
	}
	// The rank is told first (it may close connections, or save its
	// state), then nothing of it stays connected outside its container.
	mode := rankMode(cfg.Env)
	if err := r.eps.prepare(ctx, name, seq, mode, mode == rankv1.ModeApp); err != nil {
		r.eps.reopen(name)
		return nil, err
	}
	defer func() {
		if err != nil {
			r.eps.reopen(name)
		}
	}()
	netns := ""
	if cfg.Net != nil {
		netns = cfg.Net.Netns
		if err := netw.LockNetns(ctx, netns); err != nil {
			return nil, err
		}
	}
	// The prepare belongs to the round, not to this request: a caller that
	// goes away must not cancel a dump half-way.
	// An application-level rank saved its own state (its prepare
	// callback): only its files are captured, CRIU is not run.
	prep, err := r.m.Prepare(context.WithoutCancel(ctx), name, seq, container.PrepareOptions{FilesOnly: mode == rankv1.ModeApp})
	if err != nil {
		if netns != "" {
			_ = netw.UnlockNetns(context.WithoutCancel(ctx), netns)
		}
		return nil, err
	}
	return &managerPrepared{Prepared: prep, netns: netns, name: name, eps: r.eps}, nil
}

func (r managerRanks) Decided(name string, seq int, committed bool) {
	if committed {
		r.eps.committed(name, seq)
	}
}

func (r managerRanks) EndAtCheckpoint(ctx context.Context, name string) error {
	return r.m.EndAtCheckpoint(ctx, name)
}

func (r managerRanks) Stored(name string, seq int) (*image.Record, error) {
	return r.m.Repo().Load(name, seq)
}

func (r managerRanks) Lock(ctx context.Context, name string) error {
	cfg, err := r.m.Config(name)
	if err != nil {
		return err
	}
	if cfg.Net == nil {
		return nil
	}
	return netw.LockNetns(ctx, cfg.Net.Netns)
}

func (r managerRanks) Freeze(ctx context.Context, name string) error { return r.m.Pause(ctx, name) }

func (r managerRanks) Resume(ctx context.Context, name string) error {
	in, err := r.m.Get(ctx, name)
	if err != nil {
		return err
	}
	var errs []error
	if n := in.Config.Net; n != nil {
		errs = append(errs, netw.UnlockNetns(ctx, n.Netns))
	}
	errs = append(errs, r.m.Resume(ctx, name))
	r.eps.reopen(name)
	return errors.Join(errs...)
}

// managerPrepared is a container prepared by the Manager, with the
// network namespace Prepare locked ("" if none).
type managerPrepared struct {
	*container.Prepared
	netns string
	name  string
	eps   *endpoints // its rank API is served again once it runs
}

func (p *managerPrepared) Thaw(ctx context.Context) error {
	err := p.Prepared.Thaw(ctx)
	if p.netns != "" {
		err = errors.Join(err, netw.UnlockNetns(ctx, p.netns))
	}
	p.eps.reopen(p.name)
	return err
}

func (p *managerPrepared) Stop(ctx context.Context) error {
	return p.Prepared.Stop(ctx)
}

func (p *managerPrepared) Commit(ctx context.Context) (*image.Record, error) {
	defer p.eps.reopen(p.name)
	return p.Prepared.Commit(ctx, nil)
}

func (p *managerPrepared) Abort(ctx context.Context) error {
	defer p.eps.reopen(p.name)
	return p.Prepared.Abort(ctx)
}
