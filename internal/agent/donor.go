package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/lazy"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// A post-copy migration (MigrateIn.PostCopy) moves a rank without its
// memory: the target restores it from the staged image with its pages
// files left as holes, and reads the pages from the source's staging as
// the rank touches them and in the background (stagedPages). The source
// keeps the pages files open from the first request on (a donor), so
// that once the rank's container is gone (MigrateOut.Donor) and its
// staging dir with it, the pages stay readable, in tmpfs, until the
// target says it has them all (stagedDone) or stops asking
// (donorIdle). A source that dies takes its pages with it: the target's
// lazy restore fails and the rank is killed there, as a lazy restart's
// is when every holder fails.

// donorIdle is how long a donor keeps its pages with no request from
// the target: the target's prefetch asks continuously until it has every
// page. (A donor whose rank is still prepared here holds files the
// prepare holds too; once the prepare ends, only the donor does.)
const donorIdle = 2 * time.Minute

// donors are the staged images whose pages this node serves, by image.
type donors struct {
	mu sync.Mutex
	m  map[ckptKey]*donor
}

// donor is the open pages files of one staged image.
type donor struct {
	files   map[string]*os.File
	reader  string      // the agent that opened it: the only one it serves
	idle    *time.Timer // drops the donor after donorIdle without a request
	donated bool        // the rank is gone: the failpoint donor-pages applies
}

// errOtherReader is the error of a request for a donor's pages from
// another agent than the one reading them.
var errOtherReader = errors.New("its pages are being read by another node")

// get returns the donor of key for agent reader ("": the coordinator, for
// donate), opening the pages files of the rank's prepare the first time;
// log tells of a donor dropped for idleness. A donor an agent opened
// serves that agent alone: another's request is forbidden.
func (d *donors) get(key ckptKey, reader string, prepared func(ckptKey) stagedRank, log *slog.Logger) (*donor, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dn := d.m[key]; dn != nil {
		if dn.reader == "" {
			dn.reader = reader
		}
		if err := dn.admits(key, reader); err != nil {
			return nil, err
		}
		dn.idle.Reset(donorIdle)
		return dn, nil
	}
	p := prepared(key)
	if p == nil {
		return nil, &agentv1.Error{Code: agentv1.CodeNotFound, Message: fmt.Sprintf("no staged image %s:%d here", key.rank, key.ckpt)}
	}
	dn, err := openDonor(filepath.Join(p.ImageDir(), image.CRIUDir))
	if err != nil {
		return nil, err
	}
	dn.reader = reader
	if d.m == nil {
		d.m = map[ckptKey]*donor{}
	}
	d.m[key] = dn
	dn.idle = time.AfterFunc(donorIdle, func() {
		if ok, _ := d.drop(key, ""); ok {
			log.Warn("post-copy migration: no page asked for a while; the source's pages are dropped", "ckpt", fmt.Sprintf("%s:%d", key.rank, key.ckpt), "idle", donorIdle)
		}
	})
	return dn, nil
}

func openDonor(criuDir string) (*donor, error) {
	ents, err := os.ReadDir(criuDir)
	if err != nil {
		return nil, err
	}
	dn := &donor{files: map[string]*os.File{}}
	for _, e := range ents {
		if !image.IsPages(e.Name()) {
			continue
		}
		f, err := os.Open(filepath.Join(criuDir, e.Name()))
		if err != nil {
			dn.close()
			return nil, err
		}
		dn.files[e.Name()] = f
	}
	return dn, nil
}

// admits returns nil if reader ("": the coordinator, or the donor's own
// timer) may use dn, which key names, and a forbidden error if another
// agent reads it.
func (dn *donor) admits(key ckptKey, reader string) error {
	if reader == "" || dn.reader == "" || reader == dn.reader {
		return nil
	}
	return &agentv1.Error{Code: agentv1.CodeForbidden, Message: fmt.Sprintf("staged image %s:%d: %v (%s)", key.rank, key.ckpt, errOtherReader, dn.reader)}
}

func (dn *donor) close() {
	for _, f := range dn.files {
		f.Close()
	}
}

// donate makes key's donor outlive the rank's staging dir (opening it if
// no request has yet), dropped by drop or once idle.
func (d *donors) donate(key ckptKey, prepared func(ckptKey) stagedRank, log *slog.Logger) error {
	dn, err := d.get(key, "", prepared, log)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	dn.donated = true
	return nil
}

// drop closes key's donor, if there is one and reader may ("": anyone).
func (d *donors) drop(key ckptKey, reader string) (bool, error) {
	d.mu.Lock()
	dn := d.m[key]
	if dn != nil {
		if err := dn.admits(key, reader); err != nil {
			d.mu.Unlock()
			return false, err
		}
	}
	delete(d.m, key)
	d.mu.Unlock()
	if dn == nil {
		return false, nil
	}
	dn.idle.Stop()
	dn.close()
	return true, nil
}

// stagedPages serves pages of a staged image's pages file
// (agentv1.StagedPages) to a post-copy migration's target.
func (s *Server) stagedPages(w http.ResponseWriter, r *http.Request) {
	var req agentv1.StagedPages
	if !rpc.DecodeLimit(w, r, &req, 8<<20) {
		return
	}
	name, seq, ok := imageRef(w, req.Container, strconv.Itoa(req.Seq))
	if !ok {
		return
	}
	var total int64
	for _, run := range req.Runs {
		if run[0] < 0 || run[1] <= 0 || run[1] > agentv1.MaxStagedPages {
			total = agentv1.MaxStagedPages + 1
			break
		}
		total += run[1]
	}
	if !image.IsPages(req.File) || total > agentv1.MaxStagedPages {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, fmt.Sprintf("want a pages file and runs of at most %d pages in all", agentv1.MaxStagedPages))
		return
	}
	id, ok := rpc.Caller(w, r)
	if !ok {
		return
	}
	key := ckptKey{name, seq}
	dn, err := s.donors.get(key, readerOf(id), s.part.staged, s.log())
	if err != nil {
		failErr(w, err)
		return
	}
	f := dn.files[req.File]
	if f == nil {
		fail(w, http.StatusNotFound, agentv1.CodeNotFound, fmt.Sprintf("%s:%d has no %s", name, seq, req.File))
		return
	}
	if s.donors.isDonated(key) {
		s.failpoint(r.Context(), "donor-pages")
	}
	fi, err := f.Stat()
	if err != nil {
		failErr(w, err)
		return
	}
	for _, run := range req.Runs {
		if (run[0]+run[1])*lazy.PageSize > fi.Size() {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, fmt.Sprintf("pages %d..%d are past the end of %s", run[0], run[0]+run[1]-1, req.File))
			return
		}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(total*lazy.PageSize, 10))
	w.WriteHeader(http.StatusOK)
	buf := make([]byte, 1<<20)
	for _, run := range req.Runs {
		off, left := run[0]*lazy.PageSize, run[1]*lazy.PageSize
		for left > 0 {
			b := buf[:min(int64(len(buf)), left)]
			if _, err := f.ReadAt(b, off); err != nil {
				// The target counts the bytes and fails the request.
				s.log().Warn("staged pages", "ckpt", fmt.Sprintf("%s:%d", name, seq), "err", err)
				return
			}
			if _, err := w.Write(b); err != nil {
				return
			}
			off, left = off+int64(len(b)), left-int64(len(b))
		}
	}
}

func (d *donors) isDonated(key ckptKey) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	dn := d.m[key]
	return dn != nil && dn.donated
}

// stagedDone drops the pages of a staged image a post-copy target has
// all of, or gave up on; only the agent reading them may.
func (s *Server) stagedDone(w http.ResponseWriter, r *http.Request) {
	var req agentv1.ImageRef
	if !decode(w, r, &req) {
		return
	}
	id, ok := rpc.Caller(w, r)
	if !ok {
		return
	}
	dropped, err := s.donors.drop(ckptKey{req.Container, req.Seq}, readerOf(id))
	if err != nil {
		failErr(w, err)
		return
	}
	if dropped {
		s.log().Info("post-copy migration: the target has every page; the source's pages are dropped", "ckpt", fmt.Sprintf("%s:%d", req.Container, req.Seq))
	}
	w.WriteHeader(http.StatusNoContent)
}

// readerOf is the reader a caller is to a donor: an agent by its node's
// name; the coordinator and clients are no reader ("").
func readerOf(id pki.Identity) string {
	if id.Role == pki.Agent {
		return id.Name
	}
	return ""
}

// postCopy is the container.Lazy of a rank a post-copy migration brings
// from the agent at addr (node from): its pages are read from there, and
// told done there once all are here or the restore failed. abandon ends
// it instead if the restore fails before it starts.
func (s *Server) postCopy(addr, from string, ref agentv1.ImageRef) (lz *container.Lazy, abandon func()) {
	c := rpc.NewAgentClient(addr, from, s.Creds)
	ckpt := fmt.Sprintf("%s:%d", ref.Container, ref.Seq)
	end := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.StagedDone(ctx, ref); err != nil {
			s.log().Warn("post-copy migration: tell the source its pages are no longer needed", "ckpt", ckpt, "peer", from, "err", err)
		}
		c.Close()
	}
	lz = &container.Lazy{Pages: stagedPageReader{c: c, ref: ref}, Done: func(st container.LazyStats, err error) {
		defer end()
		if err != nil {
			s.log().Error("post-copy migration failed: the rank is killed", "ckpt", ckpt, "peer", from, "err", err)
			return
		}
		s.log().Info("post-copy migration: every page is here", "ckpt", ckpt, "peer", from, "pages", st.Pages, "took", st.Took)
	}}
	return lz, end
}

// stagedPageReader reads the pages of a staged image from the agent that
// staged it (stagedPages).
type stagedPageReader struct {
	c   *rpc.AgentClient
	ref agentv1.ImageRef
}

func (r stagedPageReader) ReadPages(ctx context.Context, file string, pages []int64, fn func(data []byte) error) error {
	buf := make([]byte, lazy.PageSize)
	for len(pages) > 0 {
		n := min(len(pages), agentv1.MaxStagedPages)
		req := agentv1.StagedPages{ImageRef: r.ref, File: file, Runs: runsOf(pages[:n])}
		pages = pages[n:]
		rctx, cancel := context.WithTimeout(ctx, stagedPagesTimeout)
		body, err := r.c.StagedPages(rctx, req)
		if err != nil {
			cancel()
			return fmt.Errorf("pages of %s:%d from its post-copy source: %w", r.ref.Container, r.ref.Seq, err)
		}
		for range n {
			if _, err = io.ReadFull(body, buf); err != nil {
				break
			}
			if err = fn(buf); err != nil {
				break
			}
		}
		body.Close()
		cancel()
		if err != nil {
			return fmt.Errorf("pages of %s:%d from its post-copy source: %w", r.ref.Container, r.ref.Seq, err)
		}
	}
	return nil
}

// stagedPagesTimeout bounds one request for pages (MaxStagedPages at
// most, 256 MiB): a source cut off must not leave the rank waiting on a
// page for ever.
const stagedPagesTimeout = time.Minute

// runsOf returns pages as runs of consecutive pages, [first, count].
func runsOf(pages []int64) [][2]int64 {
	var runs [][2]int64
	for _, k := range pages {
		if n := len(runs); n > 0 && runs[n-1][0]+runs[n-1][1] == k {
			runs[n-1][1]++
			continue
		}
		runs = append(runs, [2]int64{k, 1})
	}
	return runs
}
