package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/launch"
	"github.com/cairn-hpc/cairn/internal/netw"
)

// Node is what an agent knows of the node it runs on, for job networks.
type Node struct {
	Underlay netip.Addr // this node's address on the network between nodes
	Dev      string     // underlay device; "" means eth0
	// Netns is the node's network namespace under /run/netns, where its
	// job networks' devices are made; "" means the agent's own (an agent
	// runs in its node's). Tests serve several nodes from one process.
	Netns string
	// NetnsPrefix starts the names of the rank network namespaces this
	// agent makes; it must be unique on the machine.
	NetnsPrefix string
	// HostPorts are the TCP ports of this node that ranks may connect to,
	// at their job network's gateway address (netw.NodeJobNet.HostPorts):
	// the same --allow-host-port as single containers get.
	HostPorts []uint16
}

// nodeJobNet is job network vni on this node as its VNI alone names it:
// enough to detach a rank from it or delete it.
func (s *Server) nodeJobNet(vni uint32) netw.NodeJobNet {
	return netw.NodeJobNet{Netns: s.Node.Netns, Local: s.Node.Underlay, Dev: s.Node.Dev, VNI: vni, Prefix: s.Node.NetnsPrefix}
}

func (s *Server) jobNet(j agentv1.JobNet) (netw.NodeJobNet, map[netip.Addr]netip.Addr, error) {
	sub, err := netip.ParsePrefix(j.Subnet)
	if err != nil {
		return netw.NodeJobNet{}, nil, fmt.Errorf("job subnet: %w", err)
	}
	n := s.nodeJobNet(j.VNI)
	n.Subnet, n.HostPorts = sub.Masked(), s.Node.HostPorts
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
func (s *Server) ensureJobNet(ctx context.Context, j agentv1.JobNet) (netw.NodeJobNet, error) {
	n, remotes, err := s.jobNet(j)
	if err != nil {
		return n, err
	}
	// Ranks of one job on this node start in parallel: one makes the
	// devices, the others find them.
	s.netMu.Lock()
	defer s.netMu.Unlock()
	if err := n.Ensure(ctx); err != nil {
		return n, err
	}
	return n, n.SetRemotes(ctx, remotes)
}

// putJobNet makes the job's network on this node (ensureJobNet).
func (s *Server) putJobNet(ctx context.Context, j agentv1.JobNet) error {
	_, err := s.ensureJobNet(ctx, j)
	return err
}

// deleteJobNet removes the job network ?vni=N from this node.
func (s *Server) deleteJobNet(w http.ResponseWriter, r *http.Request) {
	vni, err := strconv.ParseUint(r.URL.Query().Get("vni"), 10, 24)
	if err != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "?vni=N required")
		return
	}
	if err := s.nodeJobNet(uint32(vni)).Delete(r.Context()); err != nil {
		failErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) rankRun(ctx context.Context, req agentv1.RankRun) (*container.Info, error) {
	addr, err := netip.ParseAddr(req.Addr)
	if err != nil {
		return nil, badRequest(err)
	}
	n, err := s.ensureJobNet(ctx, req.Net)
	if err != nil {
		return nil, err
	}
	name := agentv1.RankName(req.Job, req.Rank.Rank)
	// Every rank gets the tools (read-only): cairn rank talks to the rank
	// API from inside; MPI ranks need them.
	args, tools := req.Args, s.Tools
	if req.MPI != "" {
		if err := launch.CheckKind(req.MPI); err != nil {
			return nil, badRequest(err)
		}
		if s.Tools == "" {
			return nil, fmt.Errorf("node %s has no cairn tools dir for the ranks of MPI jobs (cairn agent --tools-dir)", s.Creds.Name)
		}
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
		Tools:    tools, Cwd: req.Cwd, Volumes: vols, CPUs: req.CPUs, Memory: req.Memory, PidsLimit: req.PidsLimit,
		SecretEnv: []string{launch.EnvSecret},
		RankAPI:   true,
	})
	if err != nil {
		_ = n.DetachRank(context.WithoutCancel(ctx), addr)
		return nil, err
	}
	if err := s.eps.open(name); err != nil {
		s.log().Warn("rank API", "rank", name, "err", err)
	}
	return in, nil
}

func (s *Server) rankRunWire(ctx context.Context, req agentv1.RankRun) (agentv1.Container, error) {
	in, err := s.rankRun(ctx, req)
	if err != nil {
		return agentv1.Container{}, err
	}
	return toWire(in), nil
}

// rankRemove removes a rank's container, or with Keep stops it and keeps
// its output, and detaches it from its job's network on this node: the
// attachment the request names or, when it names none (a rank this agent
// stops by itself: fenced, or placed elsewhere now), the one the container
// was made with. A stopped rank left attached would hold its address here
// as local, and this node would refuse to reach it where it runs now.
func (s *Server) rankRemove(ctx context.Context, req agentv1.RankRemove) error {
	name := agentv1.RankName(req.Job, req.Rank.Rank)
	vni, addr := req.VNI, netip.Addr{}
	if req.Addr != "" {
		var err error
		if addr, err = netip.ParseAddr(req.Addr); err != nil {
			return badRequest(err)
		}
	} else {
		vni, addr = s.attachedNet(ctx, name)
	}
	s.part.dropRank(ctx, name)
	s.eps.close(name)
	var errs []error
	remove := func() error { return s.Manager.Remove(ctx, name, true) }
	if req.Keep {
		remove = func() error { return s.Manager.Stop(ctx, name) }
	}
	if err := remove(); err != nil && !errors.Is(err, container.ErrNotFound) {
		errs = append(errs, err)
	}
	if addr.IsValid() {
		errs = append(errs, s.nodeJobNet(vni).DetachRank(ctx, addr))
	}
	return errors.Join(errs...)
}

// attachedNet is the job network attachment a rank's container was made
// with on this node (its VNI and address), if any: a netns this agent
// names for ranks, holding the address recorded beside it.
func (s *Server) attachedNet(ctx context.Context, name string) (uint32, netip.Addr) {
	in, err := s.Manager.Get(ctx, name)
	if err != nil || in.Config.Net == nil {
		return 0, netip.Addr{}
	}
	path := in.Config.Net.Netns
	vni, addr, ok := netw.ParseRankNetns(s.Node.NetnsPrefix, filepath.Base(path))
	if !ok || path != netw.NetnsPath(filepath.Base(path)) || addr != in.Config.Net.Addr {
		return 0, netip.Addr{}
	}
	return vni, addr
}

// restoreSource is where rankRestore's image comes from when not from
// the node's store: a staged image with its record (a migration), whole
// or with its pages read lazily (post-copy); or remote, an image read
// from its holders' chunks as it arrives (a restart from the stream).
type restoreSource struct {
	staged string
	rec    *image.Record
	lazy   *container.Lazy
	remote *container.Remote
}

// rankRestore restores a rank frozen into a fresh, locked network
// namespace with its address, from src, or else from its checkpoint
// req.Seq in the store or, for an image the node lacks, lazily from its
// holders (req.Lazy) or the durable tier (req.Tier). A container of that
// name left on this node (a rank that died here) is replaced, its output
// kept as an earlier incarnation's.
func (s *Server) rankRestore(ctx context.Context, req agentv1.RankRestore, src restoreSource) (_ *container.Info, err error) {
	addr, err := netip.ParseAddr(req.Addr)
	if err != nil {
		return nil, badRequest(err)
	}
	name := agentv1.RankName(req.Job, req.Rank.Rank)
	if src.staged == "" && src.remote == nil {
		_, err = s.Manager.Repo().Load(name, req.Seq)
		if errors.Is(err, image.ErrNotFound) && (len(req.Lazy) > 0 || req.Tier != nil) {
			var abandon func()
			if src.lazy, abandon, err = s.lazyRestore(ctx, name, req); err != nil {
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
	s.part.dropRank(ctx, name)
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
		Seq: req.Seq, Paused: true, Staged: src.staged, Record: src.rec, Lazy: src.lazy, Remote: src.remote, Tools: s.Tools,
		Net: &container.NetAttach{Netns: r.Path(), Addr: addr},
	})
	if err != nil {
		_ = n.DetachRank(context.WithoutCancel(ctx), addr)
		return nil, err
	}
	// Served from now on: the rank finds its socket once it runs.
	s.eps.close(name)
	if err := s.eps.open(name); err != nil {
		s.log().Warn("rank API", "rank", name, "err", err)
	}
	return in, nil
}

// holds tells whether the node's store lists checkpoint name:seq.
func (s *Server) holds(name string, seq int) bool {
	_, err := s.Manager.Repo().Load(name, seq)
	return !errors.Is(err, image.ErrNotFound)
}

// rankRestoreWire is rankRestore for a restart: an image the node lacks
// comes from the stream of req.Stream's chunks, and the reply says what
// each holder sent. The failpoint "restored" holds the reply once the
// rank is restored (frozen, network locked).
func (s *Server) rankRestoreWire(ctx context.Context, req agentv1.RankRestore) (agentv1.Container, error) {
	name := agentv1.RankName(req.Job, req.Rank.Rank)
	var src restoreSource
	var lc *lazyChunks
	if len(req.Stream) > 0 && !s.holds(name, req.Seq) {
		head, c, err := s.holderSource(ctx, "restore from the stream", name, req.Seq, req.Stream)
		if err != nil {
			return agentv1.Container{}, err
		}
		lc = c
		defer lc.close()
		src.remote = &container.Remote{Head: head, Chunks: lc}
	}
	in, err := s.rankRestore(ctx, req, src)
	if err != nil {
		return agentv1.Container{}, err
	}
	out := toWire(in)
	if lc != nil {
		out.Holders = s.streamed(src.remote.Head.Record.Name(), lc)
	}
	s.failpoint(ctx, "restored")
	return out, nil
}

func (s *Server) rankResume(ctx context.Context, req agentv1.RankResume) error {
	s.failpoint(ctx, "resume")
	return s.part.resume(ctx, rankNames(req.Ranks))
}

// prepare is the prepare phase of a global checkpoint on one rank
// (participant.prepare). The failpoint "prepared" holds the reply once the
// rank is prepared (frozen, locked, dumped).
func (s *Server) prepare(ctx context.Context, req agentv1.Prepare) (agentv1.Prepared, error) {
	out, err := s.part.prepare(ctx, ckptKey{agentv1.RankName(req.Job, req.Rank.Rank), req.Seq}, req.Hold, req.MemoryWait)
	if err == nil {
		s.failpoint(ctx, "prepared")
	}
	return out, err
}

// commit and abort are the decision on one rank's prepare. The failpoint
// "commit" holds a commit before the image is stored.
func (s *Server) commit(ctx context.Context, req agentv1.Finish) (*agentv1.Committed, error) {
	s.failpoint(ctx, "commit")
	key := ckptKey{agentv1.RankName(req.Job, req.Rank.Rank), req.Seq}
	if req.Stop {
		return s.part.commitAndStop(ctx, key)
	}
	return s.part.commit(ctx, key)
}

func (s *Server) abort(ctx context.Context, req agentv1.Finish) error {
	return s.part.abort(ctx, ckptKey{agentv1.RankName(req.Job, req.Rank.Rank), req.Seq})
}

// rankNames are the containers of ranks.
func rankNames(ranks []agentv1.Rank) []string {
	names := make([]string, len(ranks))
	for i, r := range ranks {
		names[i] = agentv1.RankName(r.Job, r.Rank)
	}
	return names
}

func badRequest(err error) error {
	return &agentv1.Error{Code: agentv1.CodeBadRequest, Message: err.Error()}
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
