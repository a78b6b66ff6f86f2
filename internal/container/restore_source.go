package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/lazy"
)

// An imageSource is where the image a restore brings back comes from. It
// does the few steps of a restore that differ with the source:
//
//   - storeImage: a checkpoint in the node's store, verified chunk by
//     chunk as it is read into a staging dir of the restore's own;
//   - a kept image (kept.go): the store's image, when the image kept in
//     staging since its checkpoint is that one; moved into the restore's
//     staging dir, it is restored as a stagedImage, reading nothing from
//     the store;
//   - stagedImage: an image the caller staged (RestoreOptions.Staged: a
//     migrated rank's, or one fetched from a peer);
//   - remoteImage: an image this node need not hold, read whole into
//     staging from its chunks as they arrive (RestoreOptions.Remote);
//   - lazyImage: an image this node need not hold, its memory arriving
//     while the processes run (RestoreOptions.Lazy, lazy.go), from its
//     chunks, or staged but for its pages (a post-copy migration).
//
// A files-only image (image.Record.FilesOnly) comes from the store, kept
// or staged, never lazily: no CRIU runs, and its command starts afresh
// on the restored files (eager).
type imageSource interface {
	// stage returns the image's staging dir, which the restore uses up:
	// the caller's for a staged image, else one made for the restore. It
	// also returns the source to bring the image in from: this one, or,
	// for the store's image, the kept image it moved into the dir.
	stage(r *restore) (dir string, src imageSource, err error)
	// bringIn puts the image in place before anything of r.target
	// changes: CRIU's files and the output in the staging dir, the fs
	// delta in r.newUpper.
	bringIn(ctx context.Context, r *restore) error
	// revive brings the processes back, once r has set up the container
	// with the fs delta as its upper dir.
	revive(ctx context.Context, r *restore) error
}

// sourceOf resolves where Restore's image comes from, and its record:
// the image of opts.Lazy, the one staged in opts.Staged, or checkpoint
// opts.Seq (0: the newest) of name in the store.
func sourceOf(m *Manager, name string, opts RestoreOptions) (imageSource, *image.Record, error) {
	switch {
	case opts.Remote != nil:
		if opts.Staged != "" || opts.Lazy != nil || opts.Remote.Head == nil || opts.Remote.Head.Record == nil || opts.Remote.Chunks == nil {
			return nil, nil, fmt.Errorf("restore %s: a restore from a remote image needs its head (with its record) and chunks, and no staged or lazy image", name)
		}
		return remoteImage{Remote: opts.Remote}, opts.Remote.Head.Record, nil
	case opts.Lazy != nil && opts.Staged != "":
		if opts.Record == nil || opts.Lazy.Pages == nil || opts.Lazy.Head != nil || opts.Lazy.Chunks != nil {
			return nil, nil, fmt.Errorf("restore %s: a lazy restore of a staged image needs its record and a reader of its pages, and no chunks", name)
		}
		return &lazyImage{lazy: opts.Lazy, staged: opts.Staged}, opts.Record, nil
	case opts.Lazy != nil:
		if opts.Lazy.Head == nil || opts.Lazy.Head.Record == nil || opts.Lazy.Chunks == nil || opts.Lazy.Pages != nil {
			return nil, nil, fmt.Errorf("restore %s: a lazy restore needs the image's head (with its record) and chunks, or a staged image", name)
		}
		return &lazyImage{lazy: opts.Lazy}, opts.Lazy.Head.Record, nil
	case opts.Staged != "":
		if opts.Record == nil {
			return nil, nil, fmt.Errorf("restore %s: a staged image needs its record", name)
		}
		return stagedImage{dir: opts.Staged}, opts.Record, nil
	}
	seq := opts.Seq
	if seq == 0 && opts.Record != nil {
		seq = opts.Record.Seq
	}
	if seq == 0 {
		latest, err := m.repo.Latest(name)
		if err != nil {
			return nil, nil, err
		}
		seq = latest.Seq
	}
	rec := opts.Record
	if rec == nil {
		var err error
		if rec, err = m.repo.Load(name, seq); err != nil {
			return nil, nil, err
		}
	}
	return storeImage{seq: seq}, rec, nil
}

// eager is the revive of an image whose files are all in staging once
// brought in: CRIU restores its processes, or, for a files-only image,
// its command starts afresh.
type eager struct{}

func (eager) revive(ctx context.Context, r *restore) error {
	if r.rec.FilesOnly {
		return r.startAfresh(ctx)
	}
	return r.criuRestore(ctx, nil)
}

// storeImage is a checkpoint in the node's store.
type storeImage struct {
	eager
	seq int // the checkpoint asked for, which names the staging dir
}

func (s storeImage) stage(r *restore) (string, imageSource, error) {
	dir, err := r.newStaging(s.seq)
	if err != nil {
		return "", nil, err
	}
	// The image kept in staging since its checkpoint, if it is this one:
	// nothing to read from the store (kept.go). Not for a copy (opts.As),
	// which holds its own lock, not the one that guards the kept image.
	if r.opts.As != "" || os.Remove(dir) != nil {
		return dir, s, nil
	}
	if r.m.takeKept(r.name, r.rec, dir) {
		r.m.log.Info("restoring from the image kept in staging", "ckpt", r.rec.Name())
		return dir, stagedImage{dir: dir}, nil
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", nil, err
	}
	return dir, s, nil
}

// bringIn reads the image from the store, verifying every chunk.
func (storeImage) bringIn(ctx context.Context, r *restore) error {
	if err := os.Mkdir(r.criuDir(), 0o700); err != nil {
		return err
	}
	if err := r.m.repo.Materialize(ctx, r.rec, r.criuDir(), r.newUpper, r.opts.Progress); err != nil {
		return fmt.Errorf("restore %s from %s: %w", r.target, r.rec.Name(), err)
	}
	if _, err := r.m.repo.MaterializeLog(ctx, r.rec, r.logFile()); err != nil {
		return fmt.Errorf("restore %s from %s: %w", r.target, r.rec.Name(), err)
	}
	return nil
}

// stagedImage is an image in a staging dir already, as Prepared.ImageDir
// leaves it: CRIU's files and the output in place, the fs delta a file
// to unpack.
type stagedImage struct {
	eager
	dir string
}

func (s stagedImage) stage(*restore) (string, imageSource, error) { return s.dir, s, nil }

// bringIn unpacks the fs delta.
func (s stagedImage) bringIn(ctx context.Context, r *restore) error {
	if err := image.UnpackDelta(ctx, filepath.Join(s.dir, image.DeltaName), r.newUpper); err != nil {
		return fmt.Errorf("restore %s from staged %s: %w", r.target, r.rec.Name(), err)
	}
	return nil
}

// lazyImage is an image restored lazily: of its memory pages, staging
// gets only those CRIU reads at restore; a page server (run) serves the
// others while the processes run.
type lazyImage struct {
	lazy   *Lazy
	staged string   // the staged image's dir, if the image is staged
	run    *lazyRun // set by bringIn
}

func (l *lazyImage) stage(r *restore) (string, imageSource, error) {
	if l.staged != "" {
		return l.staged, l, nil
	}
	dir, err := r.newStaging(r.rec.Seq)
	return dir, l, err
}

// bringIn writes what the restore needs of the image to staging and
// starts the page server, which a failed restore stops.
func (l *lazyImage) bringIn(ctx context.Context, r *restore) error {
	run, err := l.bringInFiles(ctx, r)
	if err != nil {
		return fmt.Errorf("restore %s from %s: %w", r.target, r.rec.Name(), err)
	}
	l.run = run
	r.undo.push(run.stop)
	return nil
}

// bringInFiles puts the image's files in place but for the pages the
// restore does not read itself, which the lazyRun it starts serves.
func (l *lazyImage) bringInFiles(ctx context.Context, r *restore) (*lazyRun, error) {
	if l.staged != "" {
		if err := os.Mkdir(r.workDir(), 0o700); err != nil {
			return nil, err
		}
		if err := image.UnpackDelta(ctx, filepath.Join(l.staged, image.DeltaName), r.newUpper); err != nil {
			return nil, err
		}
		sizes, err := pagesSizes(r.criuDir())
		if err != nil {
			return nil, err
		}
		return r.m.startLazy(ctx, r.rec.Name(), r.criuDir(), r.workDir(), sizes, l.lazy.Pages)
	}
	for _, d := range []string{r.criuDir(), r.workDir()} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	h := l.lazy.Head
	if err := image.MaterializeLazy(ctx, h, l.lazy.Chunks, r.criuDir(), r.newUpper, r.logFile()); err != nil {
		return nil, err
	}
	ids := h.PagesChunks()
	sizes := map[string]int64{}
	for name, c := range ids {
		sizes[name] = int64(len(c)) * lazy.PageSize
	}
	return r.m.startLazy(ctx, r.rec.Name(), r.criuDir(), r.workDir(), sizes, chunkPages{chunks: l.lazy.Chunks, ids: ids})
}

// pagesSizes returns the sizes of the pages files in a CRIU image dir.
func pagesSizes(criuDir string) (map[string]int64, error) {
	ents, err := os.ReadDir(criuDir)
	if err != nil {
		return nil, err
	}
	sizes := map[string]int64{}
	for _, e := range ents {
		if !image.IsPages(e.Name()) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("pages file %s is not a regular file", e.Name())
		}
		sizes[e.Name()] = fi.Size()
	}
	return sizes, nil
}

// revive has CRIU restore the processes, their memory served by the
// lazy-pages daemon, then lets the lazy restore go on without Restore:
// it keeps the staging dir until every page is here, and meanwhile a
// checkpoint of the container waits (memory.go).
func (l *lazyImage) revive(ctx context.Context, r *restore) error {
	if err := r.criuRestore(ctx, l.run.daemon); err != nil {
		return err
	}
	if pid, err := r.initPid(); err == nil {
		m, target, cgroups := r.m, r.target, r.st.CgroupsPath
		var once sync.Once
		end := func() { once.Do(func() { m.endLazy(target, pid, cgroups) }) }
		l.run.src.ended.Store(&end)
	}
	r.stagingTaken = true
	r.m.trackLazy(r.target, l.run)
	l.run.startPrefetch(r.m.log, r.rec.Name())
	go l.finish(r)
	return nil
}

// finish waits for the end of the lazy restore r started, removes its
// staging dir and reports the outcome: to Lazy.Done, or in the log. A
// failed one's CRIU log is kept in the container's dir.
func (l *lazyImage) finish(r *restore) {
	m, target, ckpt, lz := r.m, r.target, r.rec.Name(), l.run
	st, err := lz.wait()
	if err != nil {
		if b, rerr := os.ReadFile(filepath.Join(r.workDir(), lazyLog)); rerr == nil {
			_ = os.WriteFile(filepath.Join(m.dir(target), lazyLog), b, 0o600)
		}
		err = fmt.Errorf("%w (CRIU's log: %s)", err, filepath.Join(m.dir(target), lazyLog))
	}
	lz.err = err
	m.untrackLazy(target, lz)
	close(lz.done)
	os.RemoveAll(r.staging)
	switch {
	case l.lazy.Done != nil:
		l.lazy.Done(st, err) // the caller handles the outcome
	case err != nil:
		m.log.Error("lazy restore failed: the container is killed", "rank", target, "ckpt", ckpt, "err", err)
	default:
		m.log.Info("lazy restore complete: every page is here", "rank", target, "ckpt", ckpt,
			"pages", st.Pages, "requests", st.Requests, "took", st.Took)
	}
}

// Remote is an image in other nodes' stores, read from its chunks
// (RestoreOptions.Remote).
type Remote struct {
	Head   *image.Head
	Chunks image.Chunks
}

// remoteImage is an image read whole into staging from its chunks, then
// restored as one from the store is.
type remoteImage struct {
	eager
	*Remote
}

func (s remoteImage) stage(r *restore) (string, imageSource, error) {
	dir, err := r.newStaging(r.rec.Seq)
	return dir, s, err
}

// bringIn writes the image's files to staging, and its pages, a few
// shares at once.
func (s remoteImage) bringIn(ctx context.Context, r *restore) error {
	if err := os.Mkdir(r.criuDir(), 0o700); err != nil {
		return err
	}
	if err := image.MaterializeLazy(ctx, s.Head, s.Chunks, r.criuDir(), r.newUpper, r.logFile()); err != nil {
		return fmt.Errorf("restore %s from %s: %w", r.target, r.rec.Name(), err)
	}
	if err := writeAllPages(ctx, s.Chunks, r.criuDir(), s.Head.PagesChunks()); err != nil {
		return fmt.Errorf("restore %s from %s: %w", r.target, r.rec.Name(), err)
	}
	return nil
}
