package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/lazy"
	"github.com/cairn-hpc/cairn/internal/store"
)

// Lazy makes Restore restore lazily (see package lazy): of the image's
// memory pages, staging gets only those CRIU itself reads at restore; the
// others are served to CRIU's lazy-pages daemon as the restored processes
// touch them and then in the background, while they run.
//
// The image comes from one of two places:
//   - Head and Chunks: an image in other nodes' stores (a lazy restart),
//     its files and pages read from its chunks;
//   - with RestoreOptions.Staged: a staged image whose pages files are
//     holes of their size (image.ReceiveStaged of a stream written
//     without its pages), its pages read through Pages from where they
//     are (a post-copy migration's source).
type Lazy struct {
	Head   *image.Head
	Chunks image.Chunks
	Pages  PageReader
	// Done, if set, is called once every page has arrived (err nil) or
	// the daemon or the page server failed, which leaves the processes
	// unable to run on; it handles (logs) the outcome. Without it the
	// Manager logs it.
	Done func(LazyStats, error)
}

// PageReader reads pages of a checkpoint's pages files from elsewhere.
type PageReader interface {
	// ReadPages hands fn each of pages (indexes of 4 KiB pages in pages
	// file file) in the order asked, from any goroutine but one at a
	// time.
	ReadPages(ctx context.Context, file string, pages []int64, fn func(data []byte) error) error
}

// chunkPages reads the pages of an image's pages files from its chunks
// (one chunk per page).
type chunkPages struct {
	chunks image.Chunks
	ids    map[string][]store.ID
}

func (c chunkPages) ReadPages(ctx context.Context, file string, pages []int64, fn func(data []byte) error) error {
	all := c.ids[file]
	ids := make([]store.ID, len(pages))
	for i, k := range pages {
		if k < 0 || k >= int64(len(all)) {
			return fmt.Errorf("%s: page %d of %d", file, k, len(all))
		}
		ids[i] = all[k]
	}
	return c.chunks.GetSeq(ctx, ids, fn)
}

// LazyStats say what a lazy restore's page server served.
type LazyStats struct {
	Pages    int64         // pages served to the daemon
	Requests int64         // requests answered
	Took     time.Duration // from the restore to the last page
}

// lazyRun is a lazy restore's page server, and the argv of its
// `criu lazy-pages` daemon, which the container's shim starts and watches
// (shim.go).
type lazyRun struct {
	srv        *lazy.Server
	src        *pagesSource
	prefetched chan error // the prefetch's end
	daemon     []string

	hurried   chan struct{} // closed: the prefetch goes at full speed
	hurryOnce sync.Once
	// done is closed once the daemon has every page or the session
	// failed, err (set before) saying which.
	done chan struct{}
	err  error
}

// hurry raises the prefetch to full speed: a checkpoint waits for it.
func (r *lazyRun) hurry() { r.hurryOnce.Do(func() { close(r.hurried) }) }

// startLazy writes the pages of the image in criuDir that the restore
// itself reads into its pages files (which hold the others' places, of
// the sizes given), read from src, and starts the page server, which
// serves the others from src.
func (m *Manager) startLazy(ctx context.Context, ckpt, criuDir, workDir string, sizes map[string]int64, src PageReader) (*lazyRun, error) {
	pms, err := lazy.LoadPagemaps(criuDir)
	if err != nil {
		return nil, &image.CorruptError{Image: ckpt, What: "pagemap", Reason: err.Error(), Err: err}
	}
	for file, pages := range lazy.Eager(pms) {
		if err := writePages(ctx, src, filepath.Join(criuDir, file), pages); err != nil {
			return nil, fmt.Errorf("%s: %w", ckpt, err)
		}
	}
	ps, err := newPagesSource(criuDir, sizes, pms, src)
	if err != nil {
		return nil, err
	}
	srv, err := lazy.Listen(pms, ps, m.log)
	if err != nil {
		ps.close()
		return nil, err
	}
	return &lazyRun{srv: srv, src: ps, prefetched: make(chan error, 1), hurried: make(chan struct{}), done: make(chan struct{}), daemon: []string{m.runc.criu, "lazy-pages", "--images-dir", criuDir, "--work-dir", workDir,
		"--page-server", "--address", "127.0.0.1", "--port", strconv.Itoa(srv.Port()),
		"--status-fd", "3", "--log-file", lazyLog, "-v2"}}, nil
}

// writePages writes pages (by index) of the pages file dst, read from src.
func writePages(ctx context.Context, src PageReader, dst string, pages []int64) error {
	f, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	i := 0
	err = src.ReadPages(ctx, filepath.Base(dst), pages, func(data []byte) error {
		if len(data) != lazy.PageSize {
			return fmt.Errorf("%s: %d bytes where a page was expected", filepath.Base(dst), len(data))
		}
		_, err := f.WriteAt(data, pages[i]*lazy.PageSize)
		i++
		return err
	})
	if err != nil {
		return err
	}
	return f.Close()
}

// writeAllPages writes every page of the pages files in criuDir (made
// empty of their size by image.MaterializeLazy) from their chunks, ids,
// in shares of prefetchShare pages, hurriedStreams at once.
func writeAllPages(ctx context.Context, chunks image.Chunks, criuDir string, ids map[string][]store.ID) error {
	src := chunkPages{chunks: chunks, ids: ids}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(hurriedStreams)
	for file, c := range ids {
		for i := 0; i < len(c); i += prefetchShare {
			pages := make([]int64, min(len(c), i+prefetchShare)-i)
			for k := range pages {
				pages[k] = int64(i + k)
			}
			g.Go(func() error { return writePages(ctx, src, filepath.Join(criuDir, file), pages) })
		}
	}
	return g.Wait()
}

// endedByFile, in a container's dir, says why cairn ended the
// container's processes itself; the shim records it as the exit's Reason.
const endedByFile = "ended-by"

// lazyFailed is why a container whose lazy restore failed is ended.
const lazyFailed = "its lazy restore failed: memory pages could not be fetched"

// endLazy ends for good the processes of container name (its init pid,
// in cgroup cgroups) whose lazy restore can no longer get their pages,
// before CRIU's daemon hears of it: once the daemon is gone, a page it
// never filled reads as zeros, and the rank would run on them. The
// reason is written for the shim first; init is killed, every process of
// its pid namespace with it, and the cgroup thawed (a frozen task dies
// only once thawed). It returns once init is gone, or after 5 s.
func (m *Manager) endLazy(name string, pid int, cgroups string) {
	_ = os.WriteFile(filepath.Join(m.dir(name), endedByFile), []byte(lazyFailed), 0o600)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if fz, err := freezerFor(cgroups); err == nil {
		_ = fz.set(context.Background(), false)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if !alive(pid) {
			m.log.Warn("lazy restore failed: the container is killed", "rank", name, "pid", pid)
			return
		}
	}
	m.log.Error("lazy restore failed and the container's init did not die in 5 s", "rank", name, "pid", pid)
}

// alive tells whether process pid runs: it exists and is no zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// lazyLog is the daemon's log, in the restore's work dir; kept in the
// container's dir if the lazy restore fails.
const lazyLog = "lazy-pages.log"

// startLazyDaemon starts a `criu lazy-pages` daemon (argv, which takes
// --status-fd 3) and waits until it listens for the restore, on
// lazy-pages.socket in its work dir. The caller reaps it.
func startLazyDaemon(argv []string) (int, error) {
	ready, w, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer ready.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		w.Close()
		return 0, fmt.Errorf("criu lazy-pages: %w", err)
	}
	w.Close()
	_ = ready.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := ready.Read(make([]byte, 1)); err != nil {
		_ = cmd.Process.Kill()
		return 0, fmt.Errorf("criu lazy-pages did not start: %v", err)
	}
	return cmd.Process.Pid, nil
}

// startPrefetch starts the prefetch, once the restore is done: before,
// it would take the CPU the restore needs.
func (r *lazyRun) startPrefetch(log *slog.Logger, image string) {
	// Read once: the page server's every request would read it again.
	r.src.holdPages.Store(failpoint.Set("lazy-pages"))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-r.srv.Done()
		cancel()
	}()
	go func() {
		start := time.Now()
		err := r.src.prefetch(ctx, r.hurried)
		if err == nil {
			log.Info("lazy restore: every page prefetched", "ckpt", image, "took", time.Since(start))
		}
		r.prefetched <- err
	}()
}

// stop ends the page server of a restore that failed; the shim ends the
// daemon.
func (r *lazyRun) stop() {
	r.srv.Close()
	r.src.close()
}

// wait waits until the daemon has every page, or the session failed, and
// reports.
func (r *lazyRun) wait() (LazyStats, error) {
	// The prefetch only runs ahead of the daemon: what it failed to
	// fetch, the page server fetched when asked, or the session failed.
	err := r.srv.Err()
	<-r.prefetched
	r.src.close()
	pages, reqs, took := r.srv.Stats()
	return LazyStats{Pages: pages, Requests: reqs, Took: took}, err
}

// pagesSource serves the pages files of an image: from the sparse pages
// files in staging as far as the prefetch has filled them, else from src
// straight away.
type pagesSource struct {
	src PageReader
	// ended, once set (the processes restored), ends them for good
	// before a failure to get pages reaches CRIU's daemon: once the
	// daemon is gone, a page it never filled would read as zeros.
	ended atomic.Pointer[func()]
	files map[string]*pagesFile
	// holdPages: the restore is done and the failpoint lazy-pages is
	// set: the pages the restored processes lack are held.
	holdPages atomic.Bool
}

// pagesFile is one pages file of a lazy restore in staging.
type pagesFile struct {
	name string
	n    int64 // its pages
	f    *os.File
	lazy []int64 // the pages the page server serves, in file order

	mu   sync.Mutex
	have []bool // the page is in f
}

// prefetchShare is the pages one prefetch request asks for;
// prefetchStreams are the requests in flight, hurriedStreams those once
// a checkpoint waits for the last page.
const (
	prefetchShare   = 1024
	prefetchStreams = 4
	hurriedStreams  = 16
)

// newPagesSource opens the pages files in criuDir, of the sizes given:
// every page in them but the lazy ones of pms, which are to come.
func newPagesSource(criuDir string, sizes map[string]int64, pms map[int]*lazy.Pagemap, src PageReader) (*pagesSource, error) {
	p := &pagesSource{src: src, files: map[string]*pagesFile{}}
	for name, size := range sizes {
		if size%lazy.PageSize != 0 {
			p.close()
			return nil, fmt.Errorf("pages file %s of %d bytes: not whole pages", name, size)
		}
		f, err := os.OpenFile(filepath.Join(criuDir, name), os.O_RDWR, 0)
		if err != nil {
			p.close()
			return nil, err
		}
		have := make([]bool, size/lazy.PageSize)
		for i := range have {
			have[i] = true
		}
		p.files[name] = &pagesFile{name: name, n: size / lazy.PageSize, f: f, have: have}
	}
	for _, pm := range pms {
		pf := p.files[pm.PagesFile()]
		if pf == nil {
			continue
		}
		for _, e := range pm.Entries {
			if !e.Lazy() {
				continue
			}
			for i := range int64(e.NrPages) {
				if k := e.Off/lazy.PageSize + i; k < int64(len(pf.have)) {
					pf.have[k] = false
					pf.lazy = append(pf.lazy, k)
				}
			}
		}
	}
	for _, pf := range p.files {
		slices.Sort(pf.lazy)
	}
	return p, nil
}

// missing counts the pages not here yet.
func (p *pagesSource) missing() int {
	n := 0
	for _, pf := range p.files {
		pf.mu.Lock()
		for _, k := range pf.lazy {
			if !pf.have[k] {
				n++
			}
		}
		pf.mu.Unlock()
	}
	return n
}

func (p *pagesSource) close() {
	for _, pf := range p.files {
		pf.f.Close()
	}
}

// prefetch fills the pages files with their lazy pages, in file order, a
// few shares at once (more once hurried is closed), ahead of the
// daemon's own background requests (which ask for one range of each
// process at a time). Pages the page server fetched first are skipped.
func (p *pagesSource) prefetch(ctx context.Context, hurried <-chan struct{}) error {
	type share struct {
		pf    *pagesFile
		pages []int64
	}
	shares := make(chan share)
	var wg sync.WaitGroup
	errs := make([]error, hurriedStreams)
	stream := func(w int) {
		wg.Go(func() {
			for sh := range shares {
				if errs[w] == nil {
					errs[w] = sh.pf.fill(ctx, p.src, sh.pages)
				}
			}
		})
	}
	for w := range prefetchStreams {
		stream(w)
	}
	for _, pf := range p.files {
		for i := 0; i < len(pf.lazy); i += prefetchShare {
			sh := share{pf, pf.lazy[i:min(len(pf.lazy), i+prefetchShare)]}
			for sent := false; !sent; {
				select {
				case shares <- sh:
					sent = true
				case <-hurried:
					for w := prefetchStreams; w < hurriedStreams; w++ {
						stream(w)
					}
					hurried = nil
				case <-ctx.Done():
					sent = true
				}
			}
		}
	}
	close(shares)
	wg.Wait()
	return errors.Join(errs...)
}

// fill fetches those of pages not in the file yet and writes them there.
func (pf *pagesFile) fill(ctx context.Context, src PageReader, pages []int64) error {
	var missing []int64
	pf.mu.Lock()
	for _, k := range pages {
		if !pf.have[k] {
			missing = append(missing, k)
		}
	}
	pf.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	i := 0
	return src.ReadPages(ctx, pf.name, missing, func(data []byte) error {
		k := missing[i]
		i++
		return pf.put(k, data)
	})
}

// put writes page k into the file, once.
func (pf *pagesFile) put(k int64, data []byte) error {
	if len(data) != lazy.PageSize {
		return fmt.Errorf("%d bytes where a page was expected", len(data))
	}
	pf.mu.Lock()
	had := pf.have[k]
	pf.mu.Unlock()
	if had {
		return nil
	}
	if _, err := pf.f.WriteAt(data, k*lazy.PageSize); err != nil {
		return err
	}
	pf.mu.Lock()
	pf.have[k] = true
	pf.mu.Unlock()
	return nil
}

func (p *pagesSource) ReadPages(ctx context.Context, file string, b []byte, off int64) error {
	pf := p.files[file]
	first, n := off/lazy.PageSize, int64(len(b))/lazy.PageSize
	if pf == nil || off%lazy.PageSize != 0 || int64(len(b))%lazy.PageSize != 0 || first+n > pf.n {
		return fmt.Errorf("%s: %d bytes at %d: not pages of the file", file, len(b), off)
	}
	pf.mu.Lock()
	here := !slices.Contains(pf.have[first:first+n], false)
	pf.mu.Unlock()
	if here {
		_, err := pf.f.ReadAt(b, off)
		return err
	}
	if p.holdPages.Load() {
		failpoint.Hold(ctx, "lazy-pages", nil)
	}
	pages := make([]int64, n)
	for i := range pages {
		pages[i] = first + int64(i)
	}
	i := int64(0)
	err := p.src.ReadPages(ctx, file, pages, func(data []byte) error {
		if err := pf.put(first+i, data); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		copy(b[i*lazy.PageSize:], data)
		i++
		return nil
	})
	if err != nil {
		if end := p.ended.Load(); end != nil {
			(*end)()
		}
	}
	return err
}
