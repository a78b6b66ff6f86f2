package container

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cairn-hpc/cairn/internal/image"
)

// Prepared is a container captured into staging and still frozen: the
// first phase of a global checkpoint, which commits or aborts it once every
// rank of the job is prepared. Until then the container's lock is held, so
// nothing else changes the container. Its methods are safe for concurrent
// use; Commit or Abort must end it.
type Prepared struct {
	m       *Manager
	name    string
	seq     int
	rec     *image.Record
	staging string
	imgDir  string
	start   time.Time
	fz      freezer
	marker  string
	staged  int64

	mu     sync.Mutex
	frozen bool
	done   bool
	unlock func()
}

// Name is the prepared container's name and Seq its checkpoint number.
func (p *Prepared) Name() string { return p.name }

// Seq is the number the checkpoint will have once committed.
func (p *Prepared) Seq() int { return p.seq }

// ImageDir is where the staged image is: CRIU's files under
// image.CRIUDir (empty for a files-only checkpoint), the fs delta as
// image.DeltaName and the container's output as image.LogName, as
// Repo.Ingest takes them.
func (p *Prepared) ImageDir() string { return p.imgDir }

// Record is the record the image gets once stored.
func (p *Prepared) Record() image.Record { return *p.rec }

// Size is the staged image's size in bytes.
func (p *Prepared) Size() int64 { return p.staged }

// CRIUTime is the time runc and CRIU took to dump the processes (0 for a
// files-only checkpoint, which runs neither).
func (p *Prepared) CRIUTime() time.Duration { return p.rec.Timing.Dump }

// Dump is the time spent capturing the fs delta and dumping the processes.
func (p *Prepared) Dump() time.Duration { return p.rec.Timing.Capture + p.rec.Timing.Dump }

// resetDumpDirs empties the image and work dirs of a failed dump before the
// next attempt.
func (p *Prepared) resetDumpDirs(workDir string) error {
	criuDir := filepath.Join(p.imgDir, image.CRIUDir)
	for _, d := range []string{criuDir, workDir} {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// Thaw resumes the prepared container; the staged image stays until Commit
// or Abort. It may be called more than once.
func (p *Prepared) Thaw(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.thawLocked(ctx)
}

func (p *Prepared) thawLocked(ctx context.Context) error {
	if !p.frozen {
		return nil
	}
	if p.rec != nil {
		p.rec.Timing.Stall = time.Since(p.start)
	}
	if err := p.fz.set(context.WithoutCancel(ctx), false); err != nil {
		return fmt.Errorf("thaw %s: %w", p.name, err)
	}
	p.frozen = false
	os.Remove(p.marker)
	p.m.hold(p.name, false)
	return nil
}

// release thaws the container, drops the staged image and the lock.
func (p *Prepared) release(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return nil
	}
	err := p.thawLocked(ctx)
	if p.staging != "" && os.Getenv("CAIRN_KEEP_STAGING") == "" {
		os.RemoveAll(p.staging)
	}
	p.done = true
	p.unlock()
	return err
}

// Abort thaws the container and drops its staged image.
func (p *Prepared) Abort(ctx context.Context) error { return p.release(ctx) }

// Commit thaws the container if it is still frozen and persists its staged
// image into the store as checkpoint Seq, while the container runs on.
func (p *Prepared) Commit(ctx context.Context, progress image.Progress) (*image.Record, error) {
	// Thawed first (or Commit fails with the thaw's error), the container
	// leaves release nothing to fail at.
	defer func() { _ = p.release(ctx) }()
	if err := p.Thaw(ctx); err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		return nil, fmt.Errorf("checkpoint %s:%d was already committed or aborted", p.name, p.seq)
	}
	p.mu.Unlock()
	rec := p.rec
	if rec.Timing.Stall == 0 {
		rec.Timing.Stall = time.Since(p.start)
	}
	t := time.Now()
	if err := p.m.repo.Ingest(ctx, p.imgDir, rec, progress); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", p.name, err)
	}
	// Persist and Total are known only now: they are returned, not stored.
	rec.Timing.Persist = time.Since(t)
	rec.Timing.Total = time.Since(p.start)
	kept := p.m.keepImage(p.name, rec, p.imgDir)
	p.m.log.Info("checkpoint", "ckpt", rec.Name(), "stall", rec.Timing.Stall, "bytes", rec.Size(), "kept", kept)
	return rec, nil
}

// Stop ends the prepared container at its checkpoint, never letting it
// run again: it is marked checkpointed, its processes are killed while
// still frozen and only then thawed, to die. (If something thawed it
// before, it ran on since, and is killed now.) The staged image stays for
// Commit; the container's network is left as it is.
func (p *Prepared) Stop(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return fmt.Errorf("checkpoint %s:%d was already committed or aborted", p.name, p.seq)
	}
	st, err := p.m.loadState(p.name)
	if err != nil {
		return err
	}
	if err := p.m.endAtCheckpoint(ctx, st, p.fz); err != nil {
		return err
	}
	if p.frozen {
		if p.rec != nil {
			p.rec.Timing.Stall = time.Since(p.start)
			p.rec.Stopped = true
		}
		p.frozen = false
		os.Remove(p.marker)
		p.m.hold(p.name, false)
	}
	return nil
}

// EndAtCheckpoint ends a container that a checkpoint with stop was
// committed for, if it still runs (its prepare was lost with the process
// that held it): it is marked checkpointed and killed, frozen or not. A
// container that has ended already is left as it is.
func (m *Manager) EndAtCheckpoint(ctx context.Context, name string) error {
	unlock, err := m.lock(name)
	if err != nil {
		return err
	}
	defer unlock()
	in, err := m.Get(ctx, name)
	if err != nil {
		return err
	}
	if !in.Status.Live() {
		return nil
	}
	fz, err := freezerFor(in.CgroupsPath)
	if err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	return m.endAtCheckpoint(ctx, &in.State, fz)
}

// endAtCheckpoint marks a live container checkpointed, then kills its
// processes, which a frozen cgroup keeps from running until the thaw that
// follows lets them die. The caller holds the container's lock.
func (m *Manager) endAtCheckpoint(ctx context.Context, st *State, fz freezer) error {
	name := st.Config.Name
	st.Checkpointed = true
	if err := m.saveState(st); err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	ctx = context.WithoutCancel(ctx)
	if err := m.runc.run(ctx, "", "kill", m.runcID(name), "KILL"); err != nil {
		if in, gerr := m.Get(ctx, name); gerr != nil || in.Status.Live() {
			return fmt.Errorf("stop %s: %w", name, err)
		}
	}
	// runc thaws a paused container it kills, and its cgroup may be gone
	// with its processes already.
	if err := fz.set(ctx, false); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("stop %s: thaw the killed processes: %w", name, err)
	}
	m.waitShim(st, 10*time.Second)
	return nil
}
