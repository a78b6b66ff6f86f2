package agent

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

// What the rank API knows of a rank, from its container on this node.

// apiDir is the host dir bound at rankv1.SocketDir in container name.
func (s *Server) apiDir(name string) string { return s.Manager.APIDir(name) }

// rankSelf says who the rank in container name is: its job, rank and size
// and the job's mode (from the environment its job gave it), and its
// incarnation and the checkpoint it was restored from (from the Manager).
func (s *Server) rankSelf(ctx context.Context, name string) (rankSelf, error) {
	in, err := s.Manager.Get(ctx, name)
	if err != nil {
		return rankSelf{}, err
	}
	env := envMap(in.Config.Env)
	// Who the rank is comes from its container's name (JOB.RANK), which
	// this agent gave it, and must agree with what its environment says.
	job, rank, ok := agentv1.ParseRankName(name)
	if !ok || env["CAIRN_JOB"] != job || env["CAIRN_RANK"] != strconv.Itoa(rank) {
		return rankSelf{}, fmt.Errorf("container %s is no rank of a job", name)
	}
	self := rankSelf{Job: job, Rank: rank, Mode: rankMode(in.Config.Env)}
	self.Size, _ = strconv.Atoi(env["CAIRN_SIZE"])
	if _, seq, ok := strings.Cut(in.RestoredFrom, ":"); ok {
		self.RestoredFrom, _ = strconv.Atoi(seq)
	}
	self.Incarnation = 1
	if incs, err := s.Manager.Incarnations(name); err == nil && len(incs) > 0 {
		self.Incarnation = incs[len(incs)-1].N
	}
	return self, nil
}

// rankMode is the checkpoint mode a rank's job gave it in its environment
// (CAIRN_MODE), transparent if none.
func rankMode(env []string) string {
	if envMap(env)["CAIRN_MODE"] == rankv1.ModeApp {
		return rankv1.ModeApp
	}
	return rankv1.ModeTransparent
}

func envMap(env []string) map[string]string {
	out := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}

// openRankAPIs serves the rank API of every rank on this node.
func (s *Server) openRankAPIs(ctx context.Context) {
	list, err := s.Manager.List(ctx)
	if err != nil {
		s.log().Warn("rank API: list the ranks", "err", err)
		return
	}
	for _, in := range list {
		if envMap(in.Config.Env)["CAIRN_JOB"] == "" || !in.Status.Live() {
			continue
		}
		if err := s.eps.open(in.Name); err != nil {
			s.log().Warn("rank API", "rank", in.Name, "err", err)
		}
	}
}
