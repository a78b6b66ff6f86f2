package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "cairn/api/agent/v1"
	"cairn/internal/container"
	"cairn/internal/image"
	"cairn/internal/launch"
	"cairn/internal/netw"
	"cairn/internal/rpc"
	"cairn/internal/store"
)

// Node is what an agent knows of the node it runs on, for job networks.
type Node struct {
	Underlay netip.Addr // this node's address on the network between nodes
	Dev      string     // underlay device; "" means eth0
	// NetnsPrefix starts the names of the rank network namespaces this
	// agent makes; it must be unique on the machine.
	NetnsPrefix string
}

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

// ranks is the agent's state for job ranks.
type ranks struct {
	netMu   sync.Mutex // job network changes on this node
	mu      sync.Mutex
	pending map[pendingKey]*pending
	// committing holds commits in progress, so that a commit sent again
	// (by a coordinator that restarted) waits for the first.
	committing map[pendingKey]chan struct{}
	// aborted holds aborts that came while their prepare was still
	// running: the prepare then gives up as soon as it ends, instead of
	// holding its rank frozen until the hold expires.
	aborted map[pendingKey]time.Time
	// preparing holds prepares in progress; closed when each ends.
	preparing map[pendingKey]chan struct{}
	// held are the ranks waiting for RankResume (stalled, or migrated in),
	// with what happens when the hold ends.
	held map[string]*time.Timer
}

func (s *Server) jobNet(j v1.JobNet) (netw.NodeJobNet, map[netip.Addr]netip.Addr, error) {
	sub, err := netip.ParsePrefix(j.Subnet)
	if err != nil {
		return netw.NodeJobNet{}, nil, fmt.Errorf("job subnet: %w", err)
	}
	n := netw.NodeJobNet{Local: s.Node.Underlay, Dev: s.Node.Dev, VNI: j.VNI, Subnet: sub.Masked(), Prefix: s.Node.NetnsPrefix}
	remotes := map[netip.Addr]netip.Addr{}
	for r, at := range j.Remotes {
		ra, err1 := netip.ParseAddr(r)
		aa, err2 := netip.ParseAddr(at)
		if err := errors.Join(err1, err2); err != nil {
			return n, nil, fmt.Errorf("job network remotes: %w", err)
		}
		remotes[ra] = aa
	}
	return n, remotes, nil
}

// ensureJobNet makes the job's devices on this node and points them at the
// ranks on other nodes.
func (s *Server) ensureJobNet(ctx context.Context, j v1.JobNet) (netw.NodeJobNet, error) {
	n, remotes, err := s.jobNet(j)
	if err != nil {
		return n, err
	}
	// Ranks of one job on this node start in parallel: one makes the
	// devices, the others find them.
	s.ranks.netMu.Lock()
	defer s.ranks.netMu.Unlock()
	if err := n.Ensure(ctx); err != nil {
		return n, err
	}
	return n, n.SetRemotes(ctx, remotes)
}

func (s *Server) rankNetns(vni uint32, addr netip.Addr) string {
	n := netw.NodeJobNet{VNI: vni, Prefix: s.Node.NetnsPrefix}
	return netw.NetnsPath(n.RankNetns(addr))
}

func (s *Server) rankRun(ctx context.Context, req v1.RankRun) (*container.Info, error) {
	addr, err := netip.ParseAddr(req.Addr)
	if err != nil {
		return nil, badRequest(err)
	}
	n, err := s.ensureJobNet(ctx, req.Net)
	if err != nil {
		return nil, err
	}
	name := v1.RankName(req.Job, req.Rank.Rank)
	args, tools := req.Args, ""
	if req.MPI != "" {
		if err := launch.CheckKind(req.MPI); err != nil {
			return nil, badRequest(err)
		}
		if s.Tools == "" {
			return nil, fmt.Errorf("node %s has no cairn tools dir for the ranks of MPI jobs (cairn agent --tools-dir)", s.Creds.Name)
		}
		tools = s.Tools
		args = append([]string{container.ToolsMount + "/cairn", "rankinit", "--mpi", req.MPI, "--"}, req.Args...)
	}
	vols, err := container.ParseVolumes(req.Volumes)
	if err != nil {
		return nil, badRequest(err)
	}
	if err := findProgram(req.RootFS, req.Args[0], req.Env); err != nil {
		return nil, badRequest(err)
	}
	r, err := n.AttachRank(ctx, addr, false)
	if err != nil {
		return nil, err
	}
	in, err := s.Manager.Run(ctx, container.Config{
		Name: name, Args: args, Env: req.Env, RootFS: req.RootFS,
		Hostname: fmt.Sprintf("%s-%d", req.Job, req.Rank.Rank),
		Net:      &container.NetAttach{Netns: r.Path(), Addr: addr},
		Tools:    tools, Cwd: req.Cwd, Volumes: vols, CPUs: req.CPUs, Memory: req.Memory,
	})
	if err != nil {
		_ = n.DetachRank(context.WithoutCancel(ctx), addr)
		return nil, err
	}
	return in, nil
}

func (s *Server) rankRemove(ctx context.Context, req v1.RankRemove) error {
	name := v1.RankName(req.Job, req.Rank.Rank)
	s.dropPending(ctx, name)
	var errs []error
	remove := func() error { return s.Manager.Remove(ctx, name, true) }
	if req.Keep {
		remove = func() error { return s.Manager.Stop(ctx, name) }
	}
	if err := remove(); err != nil && !errors.Is(err, container.ErrNotFound) {
		errs = append(errs, err)
	}
	if req.Addr != "" {
		addr, err := netip.ParseAddr(req.Addr)
		if err != nil {
			return badRequest(err)
		}
		n := netw.NodeJobNet{Local: s.Node.Underlay, Dev: s.Node.Dev, VNI: req.VNI, Prefix: s.Node.NetnsPrefix}
		errs = append(errs, n.DetachRank(ctx, addr))
	}
	return errors.Join(errs...)
}

// rankRestore restores a rank frozen into a fresh, locked network
// namespace with its address, from its checkpoint req.Seq in the store or,
// with staged set, from an image staged there (a migration). A container
// of that name left on this node (a rank that died here) is replaced, its
// output kept as an earlier incarnation's.
func (s *Server) rankRestore(ctx context.Context, req v1.RankRestore, staged string, rec *image.Record) (_ *container.Info, err error) {
	addr, err := netip.ParseAddr(req.Addr)
	if err != nil {
		return nil, badRequest(err)
	}
	name := v1.RankName(req.Job, req.Rank.Rank)
	var lz *container.Lazy
	if staged == "" {
		_, err = s.Manager.Repo().Load(name, req.Seq)
		if errors.Is(err, image.ErrNotFound) && len(req.Lazy) > 0 {
			var abandon func()
			if lz, abandon, err = s.lazyRestore(ctx, name, req.Seq, req.Lazy); err != nil {
				return nil, err
			}
			defer func() {
				if err != nil {
					abandon()
				}
			}()
		} else if err != nil {
			return nil, err
		}
	}
	n, err := s.ensureJobNet(ctx, req.Net)
	if err != nil {
		return nil, err
	}
	s.dropPending(ctx, name)
	// A rank that died here is replaced in its dir: its log stays, as an
	// earlier incarnation's.
	if err := s.Manager.Stop(ctx, name); err != nil && !errors.Is(err, container.ErrNotFound) {
		return nil, err
	}
	if err := n.DetachRank(ctx, addr); err != nil {
		return nil, err
	}
	r, err := n.AttachRank(ctx, addr, true)
	if err != nil {
		return nil, err
	}
	in, err := s.Manager.Restore(ctx, name, container.RestoreOptions{
		Seq: req.Seq, Paused: true, Staged: staged, Record: rec, Lazy: lz,
		Net: &container.NetAttach{Netns: r.Path(), Addr: addr},
	})
	if err != nil {
		_ = n.DetachRank(context.WithoutCancel(ctx), addr)
		return nil, err
	}
	return in, nil
}

func (s *Server) rankResume(ctx context.Context, req v1.RankResume) error {
	var errs []error
	for _, r := range req.Ranks {
		name := v1.RankName(r.Job, r.Rank)
		s.release(name)
		in, err := s.Manager.Get(ctx, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if n := in.Config.Net; n != nil {
			if err := netw.UnlockNetns(ctx, n.Netns); err != nil {
				errs = append(errs, err)
			}
		}
		if err := s.Manager.Resume(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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

// chunks lists the chunk ids of a checkpoint image.
func (s *Server) chunks(w http.ResponseWriter, r *http.Request) {
	name, seq, ok := imageRef(w, r.URL.Query().Get("container"), r.URL.Query().Get("seq"))
	if !ok {
		return
	}
	ids, err := s.Manager.Repo().ChunkIDs(r.Context(), name, seq)
	if err != nil {
		failErr(w, err)
		return
	}
	out := v1.Chunks{IDs: make([]string, len(ids))}
	for i, id := range ids {
		out.IDs[i] = id.String()
	}
	writeJSON(w, http.StatusOK, out)
}

// exportDelta streams a checkpoint image without the chunks the caller
// has (every chunk but the ones it says it misses).
func (s *Server) exportDelta(w http.ResponseWriter, r *http.Request) {
	var req v1.ExportDelta
	if !rpc.DecodeLimit(w, r, &req, 64<<20) {
		return
	}
	name, seq, ok := imageRef(w, req.Container, strconv.Itoa(req.Seq))
	if !ok {
		return
	}
	ids, err := parseIDs(req.Missing)
	if err != nil {
		fail(w, http.StatusBadRequest, v1.CodeBadRequest, "missing: "+err.Error())
		return
	}
	missing := make(map[store.ID]bool, len(ids))
	for _, id := range ids {
		missing[id] = true
	}
	if _, err := s.Manager.Repo().Load(name, seq); err != nil {
		failErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	have := func(id store.ID) bool { return !missing[id] }
	export := func() error {
		_, err := s.Manager.Repo().ExportDelta(r.Context(), name, seq, w, have, nil)
		return err
	}
	if req.Background {
		fg := export
		export = func() error { return inBackground(fg) }
	}
	if err := export(); err != nil {
		s.log().Warn("delta export", "ckpt", fmt.Sprintf("%s:%d", name, seq), "err", err)
	}
}

func imageRef(w http.ResponseWriter, name, seqs string) (string, int, bool) {
	seq, err := strconv.Atoi(seqs)
	if err != nil || container.ValidName(name) != nil {
		fail(w, http.StatusBadRequest, v1.CodeBadRequest, "want a container name and a checkpoint number")
		return "", 0, false
	}
	return name, seq, true
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// export streams a checkpoint to another agent or a client.
func (s *Server) export(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("container")
	seq, err := strconv.Atoi(q.Get("seq"))
	if err != nil || container.ValidName(name) != nil {
		fail(w, http.StatusBadRequest, v1.CodeBadRequest, "export needs ?container=NAME&seq=N")
		return
	}
	if _, err := s.Manager.Repo().Load(name, seq); err != nil {
		failErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	// Errors after the header can only cut the stream short; the receiver
	// verifies everything and refuses a truncated export.
	export := func() error {
		_, err := s.Manager.Repo().Export(r.Context(), name, seq, w, nil)
		return err
	}
	if q.Get("background") == "1" {
		fg := export
		export = func() error { return inBackground(fg) }
	}
	if err := export(); err != nil {
		s.log().Warn("export", "ckpt", fmt.Sprintf("%s:%d", name, seq), "err", err)
	}
}

// logs streams a container's output: its current incarnation's, or with
// incarnation=N that incarnation's; with follow=1 (current only) until it
// exits.
func (s *Server) logs(w http.ResponseWriter, r *http.Request, name string) {
	q := r.URL.Query()
	n := 0
	if v := q.Get("incarnation"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			fail(w, http.StatusBadRequest, v1.CodeBadRequest, "incarnation must be a number from 1")
			return
		}
	}
	follow := q.Get("follow") == "1"
	path, err := s.Manager.IncarnationLog(name, n)
	if err != nil {
		failErr(w, err)
		return
	}
	if cur, err := s.Manager.IncarnationLog(name, 0); err != nil || cur != path {
		follow = false // an earlier incarnation's log is complete
	}
	f, err := os.Open(path)
	if err != nil {
		failErr(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			continue
		}
		if err != nil && err != io.EOF {
			return
		}
		if fl != nil {
			fl.Flush()
		}
		if !follow {
			return
		}
		if in, err := s.Manager.Get(r.Context(), name); err != nil || (in.Status != "running" && in.Status != "paused" && in.Status != "created" && in.Status != "exiting") || !isFile(f, path) {
			// One more read for what was written before the exit (or
			// before a restore made a new incarnation).
			if n, _ := f.Read(buf); n > 0 {
				_, _ = w.Write(buf[:n])
				continue
			}
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// isFile reports whether path still names the open file f.
func isFile(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 != nil || err2 != nil || os.SameFile(a, b)
}

func badRequest(err error) error { return &v1.Error{Code: v1.CodeBadRequest, Message: err.Error()} }

// incarnations lists a container's incarnations on this node.
func (s *Server) incarnations(w http.ResponseWriter, name string) {
	incs, err := s.Manager.Incarnations(name)
	if err != nil {
		failErr(w, err)
		return
	}
	out := make([]v1.Incarnation, len(incs))
	for i, inc := range incs {
		out[i] = IncarnationWire(inc)
	}
	writeJSON(w, http.StatusOK, out)
}

// IncarnationWire is an incarnation as the API shows it.
func IncarnationWire(inc container.Incarnation) v1.Incarnation {
	out := v1.Incarnation{
		N: inc.N, Started: inc.Started, RestoredFrom: inc.RestoredFrom, Restored: inc.Restored,
		Checkpointed: inc.Checkpointed, Current: inc.Current, Bytes: inc.Bytes,
	}
	if e := inc.Exit; e != nil {
		code := e.Code
		out.Ended, out.ExitCode, out.Signal = e.Time, &code, e.Signal
	}
	return out
}

// dropImages removes every checkpoint image of the given containers from
// this node's catalog.
func (s *Server) dropImages(req v1.DropImages) (v1.Dropped, error) {
	var out v1.Dropped
	repo := s.Manager.Repo()
	var errs []error
	for _, name := range req.Containers {
		if err := container.ValidName(name); err != nil {
			return out, badRequest(err)
		}
		recs, _ := repo.List(name)
		for _, rec := range recs {
			if err := repo.Remove(name, rec.Seq); err != nil && !errors.Is(err, image.ErrNotFound) {
				errs = append(errs, err)
				continue
			}
			out.Images++
		}
	}
	return out, errors.Join(errs...)
}

// findProgram checks that a rank's program exists in the rank's root (its
// lower layer: root, or the node's /), as its PATH would find it: a job
// whose program is missing is refused at once, with its name, rather than
// failing in every rank.
func findProgram(root, prog string, env []string) error {
	if root == "" {
		root = "/"
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	var dirs []string
	if strings.Contains(prog, "/") {
		if !filepath.IsAbs(prog) {
			return nil // relative to its working directory: the rank will say
		}
		dirs = []string{""}
	} else {
		dirs = filepath.SplitList(path)
	}
	for _, d := range dirs {
		// A symlink counts: it may point into the root, not the node's /.
		fi, err := os.Lstat(filepath.Join(root, d, prog))
		if err == nil && (fi.Mode()&os.ModeSymlink != 0 || fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0) {
			return nil
		}
	}
	return fmt.Errorf("%s: no such program in the ranks' root %s (PATH %s)", prog, root, path)
}
