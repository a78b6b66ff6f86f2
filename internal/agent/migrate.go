package agent

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "cairn/api/agent/v1"
	"cairn/internal/image"
	"cairn/internal/netw"
)

// A migration moves one rank while the rest of its job waits: the ranks
// that stay are stalled (rankStall), the moving rank is prepared as for a
// checkpoint (dumped into tmpfs staging, frozen, network locked), the
// target agent pulls the staged image straight from the source's staging
// (staged, migrateIn) into its own tmpfs staging and restores the rank
// frozen from there, without a round trip through either store, the source
// drops its copy (migrateOut), and RankResume starts everything again.

// stagedRecord is the name of the record in a staged-image stream.
const stagedRecord = "record.json"

// hold arms a timer for a rank that waits for RankResume: fire runs if
// none comes within d.
func (s *Server) hold(name string, d time.Duration, fire func()) {
	s.ranks.mu.Lock()
	defer s.ranks.mu.Unlock()
	if s.ranks.held == nil {
		s.ranks.held = map[string]*time.Timer{}
	}
	if t := s.ranks.held[name]; t != nil {
		t.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		s.ranks.mu.Lock()
		mine := s.ranks.held[name] == t
		if mine {
			delete(s.ranks.held, name)
		}
		s.ranks.mu.Unlock()
		if mine {
			fire()
		}
	})
	s.ranks.held[name] = t
}

// release disarms a rank's hold: RankResume came.
func (s *Server) release(name string) {
	s.ranks.mu.Lock()
	defer s.ranks.mu.Unlock()
	if t := s.ranks.held[name]; t != nil {
		t.Stop()
		delete(s.ranks.held, name)
	}
}

// rankStall locks and freezes ranks that stay where they are while
// another rank of their job moves. All or nothing: on error the ranks
// stalled so far run again.
func (s *Server) rankStall(ctx context.Context, req v1.RankStall) error {
	hold := req.Hold
	if hold <= 0 {
		hold = DefaultHold
	}
	var stalled []v1.Rank
	undo := func() {
		_ = s.rankResume(context.WithoutCancel(ctx), v1.RankResume{Ranks: stalled})
	}
	for _, r := range req.Ranks {
		name := RankName(r.Job, r.Rank)
		cfg, err := s.Manager.Config(name)
		if err != nil {
			undo()
			return err
		}
		if cfg.Net != nil {
			if err := netw.LockNetns(ctx, cfg.Net.Netns); err != nil {
				undo()
				return err
			}
		}
		stalled = append(stalled, r)
		if err := s.Manager.Pause(ctx, name); err != nil {
			undo()
			return fmt.Errorf("stall %s: %w", name, err)
		}
		s.hold(name, hold, func() {
			s.log().Warn("no resume within the hold: resuming the stalled rank", "rank", name, "hold", hold)
			_ = s.rankResume(context.Background(), v1.RankResume{Ranks: []v1.Rank{r}})
		})
	}
	return nil
}

// staged streams a prepared rank's staged image as a tar: the record
// first, then CRIU's files and the fs delta, read from tmpfs as they are.
func (s *Server) staged(w http.ResponseWriter, r *http.Request) {
	name, seq, ok := imageRef(w, r.URL.Query().Get("container"), r.URL.Query().Get("seq"))
	if !ok {
		return
	}
	s.ranks.mu.Lock()
	p := s.ranks.pending[pendingKey{name, seq}]
	s.ranks.mu.Unlock()
	if p == nil {
		fail(w, http.StatusNotFound, v1.CodeNotFound, fmt.Sprintf("no prepared image %s:%d here", name, seq))
		return
	}
	rec := p.prep.Record()
	recJSON, err := json.Marshal(rec)
	if err != nil {
		failErr(w, err)
		return
	}
	dir := p.prep.ImageDir()
	files := []string{image.DeltaName}
	ents, err := os.ReadDir(filepath.Join(dir, image.CRIUDir))
	if err != nil {
		failErr(w, err)
		return
	}
	for _, e := range ents {
		files = append(files, image.CRIUDir+"/"+e.Name())
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	tw := tar.NewWriter(w)
	err = tw.WriteHeader(&tar.Header{Name: stagedRecord, Mode: 0o600, Size: int64(len(recJSON)), Typeflag: tar.TypeReg})
	if err == nil {
		_, err = tw.Write(recJSON)
	}
	for _, f := range files {
		if err != nil {
			break
		}
		err = addFile(tw, filepath.Join(dir, f), f)
	}
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		// The receiver sees a stream cut short and refuses it.
		s.log().Warn("staged image stream", "ckpt", fmt.Sprintf("%s:%d", name, seq), "err", err)
	}
}

func addFile(tw *tar.Writer, path, name string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", name)
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: fi.Size(), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// Staged opens the staged-image stream of a rank prepared on the agent.
func (c *Client) Staged(ctx context.Context, container string, seq int) (io.ReadCloser, error) {
	return c.stream(ctx, v1.PathStaged+"?container="+url.QueryEscape(container)+"&seq="+strconv.Itoa(seq))
}

// receiveStaged unpacks a staged-image stream into dir, accepting only
// what a staged image holds: the record, the fs delta and plain files
// under criu/, each once. It returns the record and the bytes received.
func receiveStaged(r io.Reader, dir string) (image.Record, int64, error) {
	var rec image.Record
	var n int64
	seen := map[string]bool{}
	if err := os.Mkdir(filepath.Join(dir, image.CRIUDir), 0o700); err != nil {
		return rec, 0, err
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return rec, n, fmt.Errorf("staged image: %w", err)
		}
		name := hdr.Name
		base, inCRIU := strings.CutPrefix(name, image.CRIUDir+"/")
		ok := hdr.Typeflag == tar.TypeReg && hdr.Size >= 0 && !seen[name] &&
			(name == stagedRecord || name == image.DeltaName ||
				(inCRIU && base != "" && base != "." && base != ".." && !strings.ContainsAny(base, "/\x00")))
		if !ok {
			return rec, n, fmt.Errorf("staged image: unexpected entry %q", name)
		}
		seen[name] = true
		if name == stagedRecord {
			b, err := io.ReadAll(io.LimitReader(tr, 1<<20))
			if err != nil {
				return rec, n, fmt.Errorf("staged image: %w", err)
			}
			if err := json.Unmarshal(b, &rec); err != nil {
				return rec, n, fmt.Errorf("staged image: record: %w", err)
			}
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, filepath.FromSlash(name)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return rec, n, err
		}
		k, err := io.Copy(f, tr)
		n += k
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return rec, n, fmt.Errorf("staged image: %s: %w", name, err)
		}
	}
	if !seen[stagedRecord] || !seen[image.DeltaName] {
		return rec, n, errors.New("staged image: record or fs delta missing")
	}
	return rec, n, nil
}

// migrateIn receives a rank prepared on another node, stores its image
// and restores it frozen with its network locked; see v1.MigrateIn.
func (s *Server) migrateIn(ctx context.Context, req v1.MigrateIn) (v1.MigratedIn, error) {
	var out v1.MigratedIn
	name := RankName(req.Job, req.Rank.Rank)
	start := time.Now()
	c := NewClient(req.From, req.FromNode, s.Creds)
	defer c.Close()
	body, err := c.Staged(ctx, name, req.Seq)
	if err != nil {
		return out, fmt.Errorf("migrate %s from %s: %w", name, req.FromNode, err)
	}
	defer body.Close()
	if err := os.MkdirAll(s.Manager.StagingDir(), 0o700); err != nil {
		return out, err
	}
	dir, err := os.MkdirTemp(s.Manager.StagingDir(), fmt.Sprintf("migrate-%s-%d-pid%d-", name, req.Seq, os.Getpid()))
	if err != nil {
		return out, err
	}
	defer os.RemoveAll(dir)
	rec, n, err := receiveStaged(body, dir)
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
	if _, err := s.rankRestore(ctx, v1.RankRestore{Rank: req.Rank, Net: req.Net, Addr: req.Addr, Seq: req.Seq}, dir, &rec); err != nil {
		return out, fmt.Errorf("migrate %s: restore: %w", name, err)
	}
	out.Restore = time.Since(t)
	hold := req.Hold
	if hold <= 0 {
		hold = DefaultHold
	}
	vni := req.Net.VNI
	s.hold(name, hold, func() {
		// The source thaws by itself when its hold ends: this copy must
		// never run beside it.
		s.log().Warn("no resume within the hold: removing the migrated rank", "rank", name, "hold", hold)
		_ = s.rankRemove(context.Background(), v1.RankRemove{Rank: req.Rank, VNI: vni, Addr: req.Addr})
	})
	return out, nil
}

// migrateOut removes a rank that moved to another node: its prepare is
// dropped without unlocking its network (the rank runs again only to be
// killed, and cannot send a packet meanwhile), then its container and
// network namespace go.
func (s *Server) migrateOut(ctx context.Context, req v1.MigrateOut) error {
	ctx = context.WithoutCancel(ctx)
	name := RankName(req.Job, req.Rank.Rank)
	if p := s.takePending(pendingKey{name, req.Seq}); p != nil {
		p.timer.Stop()
		p.expire.Stop()
		p.mu.Lock()
		p.thawed = true // its network stays locked
		p.mu.Unlock()
		_ = p.prep.Abort(ctx)
	}
	return s.rankRemove(ctx, v1.RankRemove{Rank: req.Rank, VNI: req.VNI, Addr: req.Addr})
}

// failpoint hangs the request at a named point when CAIRN_FAILPOINT
// names it (migrate-in: the image received, before it is stored and
// restored), for end-to-end tests that kill the agent there.
func (s *Server) failpoint(ctx context.Context, name string) {
	if os.Getenv("CAIRN_FAILPOINT") != name {
		return
	}
	s.log().Warn("failpoint reached: the request hangs here", "failpoint", name)
	<-ctx.Done()
}
