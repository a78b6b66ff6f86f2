package agent

import (
	"context"
	"errors"

	"cairn/internal/container"
	"cairn/internal/image"
	"cairn/internal/netw"
)

// managerRanks are the participant's rankOps on this node's Manager and
// the ranks' network namespaces.
type managerRanks struct{ m *container.Manager }

var _ rankOps = managerRanks{}

func (r managerRanks) Prepare(ctx context.Context, name string, seq int) (stagedRank, error) {
	cfg, err := r.m.Config(name)
	if err != nil {
		return nil, err
	}
	netns := ""
	if cfg.Net != nil {
		netns = cfg.Net.Netns
		if err := netw.LockNetns(ctx, netns); err != nil {
			return nil, err
		}
	}
	// The prepare belongs to the round, not to this request: a caller that
	// goes away must not cancel a dump half-way.
	prep, err := r.m.Prepare(context.WithoutCancel(ctx), name, seq)
	if err != nil {
		if netns != "" {
			_ = netw.UnlockNetns(context.WithoutCancel(ctx), netns)
		}
		return nil, err
	}
	return &managerPrepared{Prepared: prep, netns: netns}, nil
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
	return errors.Join(errs...)
}

// managerPrepared is a container prepared by the Manager, with the
// network namespace Prepare locked ("" if none).
type managerPrepared struct {
	*container.Prepared
	netns string
}

func (p *managerPrepared) Thaw(ctx context.Context) error {
	err := p.Prepared.Thaw(ctx)
	if p.netns != "" {
		err = errors.Join(err, netw.UnlockNetns(ctx, p.netns))
	}
	return err
}

func (p *managerPrepared) Commit(ctx context.Context) (*image.Record, error) {
	return p.Prepared.Commit(ctx, nil)
}
