// The agent's membership of the cluster: join, heartbeats, join again.

package agent

import (
	"context"
	"errors"
	"log/slog"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// member is the node's side of its membership: what its heartbeats say,
// and what it makes of the coordinator's replies.
type member interface {
	beat() coordv1.Heartbeat
	joined(coordv1.JoinReply)
	answered(context.Context, coordv1.HeartbeatReply)
}

// keepJoined joins the cluster and sends heartbeats, each what m's beat
// reports then, until ctx ends; it joins again whenever the coordinator
// no longer knows the node. m is told every reply.
func keepJoined(ctx context.Context, cl *rpc.CoordClient, j coordv1.Join, m member, log *slog.Logger) {
	defer cl.Close()
	every := time.Second
	joined := false
	for {
		var err error
		if !joined {
			var reply coordv1.JoinReply
			reply, err = cl.Join(ctx, j)
			if err == nil {
				m.joined(reply)
				joined = true
				if reply.Heartbeat > 0 {
					every = reply.Heartbeat
				}
				log.Info("joined the cluster", "node", j.Name, "heartbeat", every)
			}
		} else {
			hctx, cancel := context.WithTimeout(ctx, every*2)
			var reply coordv1.HeartbeatReply
			reply, err = cl.Heartbeat(hctx, m.beat())
			cancel()
			if err == nil {
				m.answered(ctx, reply)
			}
			var we *agentv1.Error
			if errors.As(err, &we) && we.Code == agentv1.CodeNotFound {
				joined = false
				continue
			}
		}
		wait := every
		var we *agentv1.Error
		switch {
		case err == nil || ctx.Err() != nil:
		case !joined && errors.As(err, &we) && we.Code == coordv1.CodeVersion:
			// Not healed by trying again at once: by an upgrade.
			log.Error("the coordinator refuses this agent's API version; trying again every 30 s", "err", err)
			wait = 30 * time.Second
		default:
			log.Warn("coordinator", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
