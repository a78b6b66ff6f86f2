package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// A migration moves one rank while the rest of its job waits: the ranks
// that stay are stalled (rankStall), the moving rank is prepared as for a
// checkpoint (dumped into tmpfs staging, frozen, network locked), the
// target agent pulls the staged image straight from the source's staging
// (staged, migrateIn) into its own tmpfs staging and restores the rank
// frozen from there, without a round trip through either store, the source
// drops its copy (migrateOut), and RankResume starts everything again.

// rankStall stalls ranks that stay where they are while another rank of
// their job moves (participant.stall).
func (s *Server) rankStall(ctx context.Context, req agentv1.RankStall) error {
	return s.part.stall(ctx, rankNames(req.Ranks), req.Hold)
}

// staged streams a prepared rank's staged image (image.WriteStaged): the
// record first, then CRIU's files and the fs delta, read from tmpfs as
// they are, after announcing its size.
func (s *Server) staged(w http.ResponseWriter, r *http.Request) {
	name, seq, ok := imageRef(w, r.URL.Query().Get("container"), r.URL.Query().Get("seq"))
	if !ok {
		return
	}
	p := s.part.staged(ckptKey{name, seq})
	if p == nil {
		fail(w, http.StatusNotFound, agentv1.CodeNotFound, fmt.Sprintf("no prepared image %s:%d here", name, seq))
		return
	}
	started := false
	announce := func(size int64) {
		started = true
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set(agentv1.HeaderStagedSize, strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
	}
	rec := p.Record()
	write := image.WriteStaged
	if r.URL.Query().Get("lazy") == "1" {
		write = image.WriteStagedLazy
	}
	if err := write(w, p.ImageDir(), &rec, announce); err != nil {
		if !started {
			failErr(w, err)
			return
		}
		// The receiver sees a stream cut short and refuses it.
		s.log().Warn("staged image stream", "ckpt", fmt.Sprintf("%s:%d", name, seq), "err", err)
	}
}

// migrateIn receives a rank prepared on another node, stores its image
// and restores it frozen with its network locked; see agentv1.MigrateIn.
func (s *Server) migrateIn(ctx context.Context, req agentv1.MigrateIn) (agentv1.MigratedIn, error) {
	var out agentv1.MigratedIn
	name := agentv1.RankName(req.Job, req.Rank.Rank)
	start := time.Now()
	c := rpc.NewAgentClient(req.From, req.FromNode, s.Creds)
	defer c.Close()
	body, size, err := c.Staged(ctx, name, req.Seq, req.PostCopy)
	if errors.Is(err, rpc.ErrNoStagedSize) {
		err = &image.CorruptError{Image: fmt.Sprintf("%s:%d", name, req.Seq), What: "staged image stream", Reason: err.Error(), Err: err}
	}
	if err != nil {
		return out, fmt.Errorf("migrate %s from %s: %w", name, req.FromNode, err)
	}
	defer body.Close()
	if _, err := s.Manager.StagingRoot(); err != nil {
		return out, err
	}
	dir, err := os.MkdirTemp(s.Manager.StagingDir(), fmt.Sprintf("migrate-%s-%d-pid%d-", name, req.Seq, os.Getpid()))
	if err != nil {
		return out, err
	}
	restoring := false // from then on, the restore uses dir up
	defer func() {
		if !restoring {
			os.RemoveAll(dir)
		}
	}()
	rec, n, err := image.ReceiveStaged(body, dir, size)
	out.Bytes, out.Move = n, time.Since(start)
	if err != nil {
		return out, fmt.Errorf("migrate %s from %s: %w", name, req.FromNode, err)
	}
	if rec.Container != name || rec.Seq != req.Seq {
		return out, fmt.Errorf("migrate %s:%d from %s: got %s", name, req.Seq, req.FromNode, rec.Name())
	}
	s.failpoint(ctx, "migrate-in")
	// Restored straight from the staged image: the store is no part of a
	// move (the image is no consistent cut of the job, so no checkpoint).
	t := time.Now()
	var lz *container.Lazy
	abandon := func() {}
	if req.PostCopy {
		lz, abandon = s.postCopy(req.From, req.FromNode, agentv1.ImageRef{Container: name, Seq: req.Seq})
	}
	restoring = true
	if _, err := s.rankRestore(ctx, agentv1.RankRestore{Rank: req.Rank, Net: req.Net, Addr: req.Addr, Seq: req.Seq}, restoreSource{staged: dir, rec: &rec, lazy: lz}); err != nil {
		abandon()
		return out, fmt.Errorf("migrate %s: restore: %w", name, err)
	}
	out.Restore = time.Since(t)
	hold := holdOr(req.Hold)
	vni := req.Net.VNI
	s.part.hold(name, hold, func() {
		// The source thaws by itself when its hold ends: this copy must
		// never run beside it.
		s.log().Warn("no resume within the hold: removing the migrated rank", "rank", name, "hold", hold)
		if err := s.rankRemove(context.Background(), agentv1.RankRemove{Rank: req.Rank, VNI: vni, Addr: req.Addr}); err != nil {
			s.log().Error("remove the migrated rank at the end of the hold", "rank", name, "err", err)
		}
	})
	return out, nil
}

// migrateOut removes a rank that moved to another node: its prepare is
// dropped without unlocking its network (the rank runs again only to be
// killed, and cannot send a packet meanwhile), then its container and
// network namespace go. A donor's pages stay for the target (donor.go).
func (s *Server) migrateOut(ctx context.Context, req agentv1.MigrateOut) error {
	ctx = context.WithoutCancel(ctx)
	name := agentv1.RankName(req.Job, req.Rank.Rank)
	if req.Donor {
		if err := s.donors.donate(ckptKey{name, req.Seq}, s.part.staged, s.log()); err != nil {
			return fmt.Errorf("keep the pages of %s:%d for its post-copy target: %w", name, req.Seq, err)
		}
	}
	_ = s.part.migrateOut(ctx, ckptKey{name, req.Seq})
	return s.rankRemove(ctx, agentv1.RankRemove{Rank: req.Rank, VNI: req.VNI, Addr: req.Addr})
}

// failpoint hangs the request at a named point when CAIRN_FAILPOINT
// names it (migrate-in: the image received, before it is stored and
// restored; chunk-data: a holder asked for its second share of an image
// fetch), for end-to-end tests that kill the agent there.
func (s *Server) failpoint(ctx context.Context, name string) { failpoint.Hold(ctx, name, s.log()) }
