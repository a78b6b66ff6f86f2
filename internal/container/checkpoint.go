package container

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"cairn/internal/criu"
	"cairn/internal/image"
	"cairn/internal/names"
	"cairn/internal/netw"
)

// ErrDumpFailed is returned when CRIU could not dump a container. The
// container keeps running and no checkpoint is listed.
var ErrDumpFailed = errors.New("checkpoint dump failed")

// ErrUserNSCheckpoint is returned for a checkpoint of a container run in a
// user namespace of its own (Config.UserNS): CRIU dumps only containers
// whose every namespace belongs to their user namespace, and the network
// namespace cairn keeps for a container (so that its address and TCP
// connections survive a restore) belongs to the host's.
var ErrUserNSCheckpoint = errors.New("a container with a user namespace of its own (--userns) cannot be checkpointed: CRIU needs all of its namespaces to belong to that user namespace, and the network namespace that keeps its address belongs to the host")

// ErrDumpTimeout is wrapped (with ErrDumpFailed) by a checkpoint whose CRIU
// dump did not finish within Options.DumpTimeout and was killed.
var ErrDumpTimeout = errors.New("dump timed out")

// CheckpointOptions tunes Checkpoint.
type CheckpointOptions struct {
	Stop     bool           // stop the container after the dump instead of resuming it
	Progress image.Progress // reports the ingest into the store; may be nil
}

// imageConfig is the container config recorded in an image.
type imageConfig struct {
	Config
	Addr string `json:"addr"`
}

// Checkpoint captures a running container: its processes with CRIU and its
// fs delta. The container is paused (frozen) for the capture and resumed
// as soon as its state is in staging; the image is persisted after that.
// On any error the container is resumed and no image is listed.
func (m *Manager) Checkpoint(ctx context.Context, name string, opts CheckpointOptions) (*image.Record, error) {
	p, err := m.prepare(ctx, name, 0, opts.Stop)
	if err != nil {
		return nil, err
	}
	return p.Commit(ctx, opts.Progress)
}

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
// image.CRIUDir, the fs delta as image.DeltaName and the container's
// output as image.LogName, as Repo.Ingest takes them.
func (p *Prepared) ImageDir() string { return p.imgDir }

// Record is the record the image gets once stored.
func (p *Prepared) Record() image.Record { return *p.rec }

// Size is the staged image's size in bytes.
func (p *Prepared) Size() int64 { return p.staged }

// CRIUTime is the time runc and CRIU took to dump the processes.
func (p *Prepared) CRIUTime() time.Duration { return p.rec.Timing.Dump }

// Dump is the time spent capturing the fs delta and dumping the processes.
func (p *Prepared) Dump() time.Duration { return p.rec.Timing.Capture + p.rec.Timing.Dump }

// Prepare freezes a running container and captures it (fs delta, then
// processes with CRIU) into staging, leaving it frozen: the prepare phase
// of a global checkpoint. seq is the checkpoint's number (0: the next
// free one); a checkpoint of that number must not exist. On error the
// container is thawed and nothing is kept.
func (m *Manager) Prepare(ctx context.Context, name string, seq int) (*Prepared, error) {
	return m.prepare(ctx, name, seq, false)
}

func (m *Manager) prepare(ctx context.Context, name string, seq int, stop bool) (_ *Prepared, err error) {
	if seq < 0 {
		return nil, fmt.Errorf("%w: checkpoint number %d", names.ErrInvalid, seq)
	}
	info, err := m.CRIU(ctx)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	unlock, err := m.lock(name)
	if err != nil {
		return nil, err
	}
	p := &Prepared{m: m, name: name, unlock: unlock}
	defer func() {
		if err != nil {
			p.release(context.WithoutCancel(ctx))
		}
	}()
	// Wait first for any orphaned dump; Get then thaws what it left frozen.
	if err := m.waitOrphans(name, 30*time.Second); err != nil {
		return nil, err
	}
	in, err := m.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if in.Status != "running" && in.Status != "paused" {
		return nil, fmt.Errorf("%w: %s is %s", ErrNotRunning, name, in.Status)
	}
	st := &in.State
	if st.Config.UserNS {
		return nil, fmt.Errorf("checkpoint %s: %w", name, ErrUserNSCheckpoint)
	}
	if seq == 0 {
		seq = m.repo.NextSeq(name)
	} else if _, err := m.repo.Load(name, seq); err == nil {
		return nil, fmt.Errorf("%w: checkpoint %s:%d", ErrExists, name, seq)
	}
	p.seq = seq
	if err := os.MkdirAll(m.opts.StagingDir, 0o700); err != nil {
		return nil, fmt.Errorf("staging dir: %w", err)
	}
	m.cleanStaging()
	p.staging, err = os.MkdirTemp(m.opts.StagingDir, fmt.Sprintf("%s-%d-pid%d-", name, seq, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("staging dir: %w", err)
	}
	// Who uses this staging dir: this process, and once it runs, runc (with
	// CRIU under it), which outlives this process if it is killed and must
	// not lose its staging dir to cleanStaging.
	owner := filepath.Join(p.staging, stagingOwner)
	if err := os.WriteFile(owner, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, err
	}
	p.imgDir = filepath.Join(p.staging, "image")
	workDir := filepath.Join(p.staging, "work")
	for _, d := range []string{filepath.Join(p.imgDir, image.CRIUDir), workDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}

	p.fz, err = freezerFor(st.CgroupsPath)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	var timing image.Timing
	p.start = time.Now()
	wasPaused := in.Status == "paused"
	if !wasPaused {
		// Say who froze the container, so that if this process dies before
		// thawing it, the next cairn command thaws it (recoverFreeze).
		p.marker = filepath.Join(m.dir(name), freezeMarker)
		note := freezeNote{PID: os.Getpid(), Deadline: time.Now().Add(m.opts.DumpTimeout + dumpGrace).Unix()}
		if err := writeFreezeNote(p.marker, note); err != nil {
			return nil, err
		}
		m.hold(name, true)
		p.frozen = true
		if err := p.fz.set(ctx, true); err != nil {
			return nil, fmt.Errorf("checkpoint %s: freeze: %w", name, err)
		}
		if ok, err := p.fz.settleVfork(ctx); err != nil {
			return nil, fmt.Errorf("checkpoint %s: freeze: %w", name, err)
		} else if !ok {
			m.log.Warn("a process still waits for a vfork child; dumping anyway", "container", name)
		}
	}
	// Frozen, the container starts nothing new: what exec started is all
	// there is.
	if execd, err := execProcesses(p.fz, in.Pid); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	} else if len(execd) > 0 {
		return nil, fmt.Errorf("checkpoint %s: %w: %s; end them and checkpoint again", name, ErrExecProcesses, strings.Join(execd, ", "))
	}

	// 1. The fs delta, while nothing can write to it.
	t := time.Now()
	delta, err := captureDelta(filepath.Join(m.dir(name), "upper"), filepath.Join(p.imgDir, image.DeltaName))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	timing.Capture = time.Since(t)

	// 2. The processes.
	if stop {
		st.Checkpointed = true
		if err := m.saveState(st); err != nil {
			return nil, err
		}
	}
	args := []string{"checkpoint", "--tcp-established", "--image-path", filepath.Join(p.imgDir, image.CRIUDir), "--work-path", workDir}
	if !stop {
		args = append(args, "--leave-running")
	}
	t = time.Now()
	// The marker also names runc: if this process dies, the orphaned runc
	// and its CRIU finish the dump and leave the cgroup frozen as they found
	// it, so recoverFreeze must wait for them before it thaws.
	noteRunc := func(pid int) error {
		pids := []byte(fmt.Sprintf("%d %d", os.Getpid(), pid))
		if err := os.WriteFile(owner, pids, 0o600); err != nil {
			return err
		}
		if p.marker == "" {
			return nil
		}
		return writeFreezeNote(p.marker, freezeNote{PID: os.Getpid(), Runc: pid, Deadline: time.Now().Add(m.opts.DumpTimeout + dumpGrace).Unix()})
	}
	// A dump that hangs (CRIU has been seen stuck attaching to a stopped
	// process in the frozen cgroup) is killed at the dump timeout, CRIU
	// first; the deferred release then thaws the container.
	dumpCtx, cancelDump := context.WithTimeout(ctx, m.opts.DumpTimeout)
	var dumpErr error
	for attempt := 1; ; attempt++ {
		dumpErr = m.runc.runNotify(dumpCtx, filepath.Join(m.dir(name), "runc-checkpoint.log"), noteRunc, append(args, m.runcID(name))...)
		if dumpErr == nil || attempt == maxDumpAttempts || dumpCtx.Err() != nil || !unseizable(workDir) {
			break
		}
		// The container is still frozen; an exiting task is a zombie by
		// now, and a vfork pair is let run to the child's exec.
		m.log.Info("CRIU could not seize a task; dumping again", "container", name, "attempt", attempt+1)
		if err := p.resetDumpDirs(workDir); err != nil {
			cancelDump()
			return nil, fmt.Errorf("checkpoint %s: %w", name, err)
		}
		if tgt := m.watchTarget(st); tgt.Netns != "" {
			_ = netw.DropCRIULock(context.WithoutCancel(ctx), tgt.Netns)
		}
		if p.frozen {
			_, _ = p.fz.settleVfork(dumpCtx)
		}
		select {
		case <-dumpCtx.Done():
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
	timedOut := dumpCtx.Err() == context.DeadlineExceeded
	cancelDump()
	timing.Dump = time.Since(t)
	if timedOut && dumpErr != nil {
		dumpErr = fmt.Errorf("%w after %v: %v", ErrDumpTimeout, m.opts.DumpTimeout, dumpErr)
	}
	if dumpErr != nil {
		// A CRIU that died mid-dump leaves its network lock behind.
		if tgt := m.watchTarget(st); tgt.Netns != "" {
			if err := netw.DropCRIULock(context.WithoutCancel(ctx), tgt.Netns); err != nil {
				m.log.Warn("drop CRIU's network lock after a failed dump", "container", name, "err", err)
			}
		}
		if stop {
			st.Checkpointed = false
			_ = m.saveState(st)
		}
		detail := ""
		if b, err := os.ReadFile(filepath.Join(workDir, "dump.log")); err == nil {
			keep := filepath.Join(m.dir(name), "dump.log")
			_ = os.WriteFile(keep, b, 0o600)
			detail = fmt.Sprintf(" (CRIU: %s; full log: %s)", criu.LastErrors(b, 3), keep)
		}
		if pid := parasiteIn(p.fz); pid != 0 {
			return nil, fmt.Errorf("%w: %s: %w%s; %w: CRIU's parasite is still in pid %d", ErrDumpFailed, name, dumpErr, detail, ErrDamaged, pid)
		}
		return nil, fmt.Errorf("%w: %s: %w%s", ErrDumpFailed, name, dumpErr, detail)
	}
	if stop && p.frozen {
		p.frozen = false // runc removed the container after the dump
		os.Remove(p.marker)
		m.hold(name, false)
	}

	cfg, err := json.Marshal(imageConfig{Config: st.Config, Addr: st.Addr.String()})
	if err != nil {
		return nil, err
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	p.rec = &image.Record{
		Container:   name,
		Seq:         seq,
		Created:     p.start.UTC(),
		CRIUVersion: info.Version.String(),
		Kernel:      unix.ByteSliceToString(uts.Release[:]),
		Stopped:     stop,
		Config:      cfg,
		Delta:       delta,
		Timing:      timing,
	}
	// The output up to the freeze, with what was still in the pipe
	// (output.go); the processes are still frozen, or gone with stop.
	if p.rec.Log, err = m.keepOutput(ctx, st, p.imgDir, stop); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	p.staged, _ = dirSize(p.imgDir)
	return p, nil
}

// restored describes a container Restore has just started, without asking
// runc (a process start) what Restore knows.
func (m *Manager) restored(name string, st *State, paused bool) (*Info, error) {
	b, err := os.ReadFile(filepath.Join(m.dir(name), "init.pid"))
	if err != nil {
		return nil, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("pid file %q: %w", b, err)
	}
	in := m.info(name, st)
	in.Status, in.Pid = "running", pid
	if paused {
		in.Status = "paused"
	}
	return in, nil
}

// maxDumpAttempts bounds the dumps of one checkpoint when processes vanish
// under CRIU's seize.
const maxDumpAttempts = 3

// unseizable tells whether a failed dump failed only because CRIU could not
// stop one of the container's tasks: one that was exiting when the cgroup
// froze (the freezer does not stop it, and it is gone a moment later), or
// the parent of a vfork whose child CRIU seized before its exec.
func unseizable(workDir string) bool {
	b, err := os.ReadFile(filepath.Join(workDir, "dump.log"))
	return err == nil && bytes.Contains(b, []byte("Unseizable non-zombie"))
}

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
	if err != nil {
		p.m.log.Warn("resume after checkpoint", "container", p.name, "err", err)
	}
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
	defer p.release(ctx)
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

// dirSize is the total size of the regular files under dir.
func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	return n, err
}

func captureDelta(upper, dst string) (image.DeltaStats, error) {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return image.DeltaStats{}, err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	st, err := image.PackDelta(upper, bw)
	if err != nil {
		return st, err
	}
	return st, bw.Flush()
}

// RestoreOptions tunes Restore.
type RestoreOptions struct {
	Seq      int            // checkpoint number; 0 means the newest
	As       string         // restore as a new container of this name
	Progress image.Progress // reports reading the image; may be nil
	// Net replaces the network namespace recorded in the image (a rank
	// restored on another node joins a namespace made there).
	Net *NetAttach
	// Paused leaves the restored processes frozen, for Resume to start
	// them: the ranks of a job are all restored before any runs.
	Paused bool
	// Staged restores from an image staged in this directory (CRIU's
	// files under image.CRIUDir, the fs delta as image.DeltaName, the
	// output as image.LogName, as Prepared.ImageDir leaves them),
	// described by Record, instead of a
	// checkpoint in the store: how a migrated rank is restored without a
	// round trip through the store. The directory is used up.
	Staged string
	Record *image.Record
	// Lazy restores from an image this node need not hold, its memory
	// arriving while the processes run (lazy.go).
	Lazy *Lazy
}

// Restore brings a container back from one of its checkpoints: the image is
// verified while it is copied to staging (a corrupt or truncated image is
// refused before anything is changed and before CRIU runs), then the
// container gets a fresh overlay holding the checkpoint's fs delta, a fresh
// network namespace with its address, and CRIU restores its processes.
// Its log starts with the output kept with the checkpoint, so it reads as
// an uninterrupted run's; the log of a container restored in place is
// kept as an earlier incarnation's (see Incarnations). The container must
// not be running (use opts.As to restore a copy beside it).
func (m *Manager) Restore(ctx context.Context, name string, opts RestoreOptions) (*Info, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if _, err := m.CRIU(ctx); err != nil {
		return nil, fmt.Errorf("restore %s: %w", name, err)
	}
	target := name
	if opts.As != "" {
		if err := ValidName(opts.As); err != nil {
			return nil, err
		}
		target = opts.As
	}
	seq := opts.Seq
	if opts.Lazy != nil {
		if opts.Staged != "" || opts.Lazy.Head == nil || opts.Lazy.Chunks == nil {
			return nil, fmt.Errorf("restore %s: a lazy restore needs the image's head and chunks, and no staged image", name)
		}
		opts.Record = opts.Lazy.Head.Record
		seq = opts.Record.Seq
	} else if opts.Staged != "" {
		if opts.Record == nil {
			return nil, fmt.Errorf("restore %s: a staged image needs its record", name)
		}
		seq = opts.Record.Seq
	} else if seq == 0 {
		latest, err := m.repo.Latest(name)
		if err != nil {
			return nil, err
		}
		seq = latest.Seq
	}
	begin := time.Now()
	unlock, err := m.lock(target)
	if err != nil {
		return nil, err
	}
	defer unlock()

	existing, err := m.Get(ctx, target)
	switch {
	case err == nil:
		if existing.Status == "running" || existing.Status == "paused" || existing.Status == "created" {
			return nil, fmt.Errorf("%w: %s; stop it first (cairn rm -f %s) or restore a copy with --as NEWNAME", ErrRunning, target, target)
		}
	case !errors.Is(err, ErrNotFound):
		return nil, err
	}

	// Read the whole image, verifying every chunk, before touching anything:
	// CRIU's files into staging (tmpfs), the fs delta into a new upper dir
	// on the data disk, renamed into place once the old runtime is gone.
	staging, man := opts.Staged, opts.Record
	staged := staging != ""
	if !staged {
		if err := os.MkdirAll(m.opts.StagingDir, 0o700); err != nil {
			return nil, fmt.Errorf("staging dir: %w", err)
		}
		m.cleanStaging()
		if staging, err = os.MkdirTemp(m.opts.StagingDir, fmt.Sprintf("restore-%s-%d-pid%d-", target, seq, os.Getpid())); err != nil {
			return nil, err
		}
		if opts.Lazy == nil {
			if man, err = m.repo.Load(name, seq); err != nil {
				os.RemoveAll(staging)
				return nil, err
			}
		}
		// The image kept in staging since its checkpoint, if it is this
		// one: nothing to read from the store (kept.go).
		if opts.As == "" && opts.Lazy == nil && os.Remove(staging) == nil {
			if staged = m.takeKept(name, man, staging); staged {
				m.log.Info("restoring from the image kept in staging", "ckpt", man.Name())
			} else if err := os.Mkdir(staging, 0o700); err != nil {
				return nil, err
			}
		}
	}
	// A lazy restore's staging stays until its daemon has every page.
	var lz *lazyRun
	lazyStarted := false
	defer func() {
		if lz == nil {
			os.RemoveAll(staging)
		}
	}()
	var cfg imageConfig
	if err := json.Unmarshal(man.Config, &cfg); err != nil {
		return nil, &image.CorruptError{Image: man.Name(), What: "record", Reason: "config: " + err.Error()}
	}
	criuDir := filepath.Join(staging, image.CRIUDir)
	newUpper, err := os.MkdirTemp(filepath.Join(m.opts.DataDir, "containers"), ".restore-"+target+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(newUpper)
	if err := os.Chmod(newUpper, 0o755); err != nil {
		return nil, err
	}
	workDir := filepath.Join(staging, "work")
	switch {
	case staged:
		if err := image.UnpackDelta(ctx, filepath.Join(staging, image.DeltaName), newUpper); err != nil {
			return nil, fmt.Errorf("restore %s from staged %s: %w", target, man.Name(), err)
		}
	case opts.Lazy != nil:
		for _, d := range []string{criuDir, workDir} {
			if err := os.Mkdir(d, 0o700); err != nil {
				return nil, err
			}
		}
		run, err := m.prepareLazy(ctx, opts.Lazy, criuDir, workDir, newUpper, filepath.Join(staging, image.LogName))
		if err != nil {
			return nil, fmt.Errorf("restore %s from %s: %w", target, man.Name(), err)
		}
		lz = run
		defer func() {
			if lz != nil && !lazyStarted {
				lz.stop()
				lz = nil
				os.RemoveAll(staging)
			}
		}()
	default:
		if err := os.Mkdir(criuDir, 0o700); err != nil {
			return nil, err
		}
		if err := m.repo.Materialize(ctx, man, criuDir, newUpper, opts.Progress); err != nil {
			return nil, fmt.Errorf("restore %s from %s: %w", target, man.Name(), err)
		}
		if _, err := m.repo.MaterializeLog(ctx, man, filepath.Join(staging, image.LogName)); err != nil {
			return nil, fmt.Errorf("restore %s from %s: %w", target, man.Name(), err)
		}
	}
	stagedAt := time.Since(begin)
	history := filepath.Join(staging, image.LogName)
	if _, err := os.Lstat(history); err != nil {
		history = "" // an image from before the output was kept
	}

	// Replace the old runtime of target, or make a new container.
	var st *State
	if existing != nil {
		st = &existing.State
		if err := m.teardown(ctx, st); err != nil {
			return nil, fmt.Errorf("restore %s: clean up old container: %w", target, err)
		}
		for _, d := range []string{"upper", "work"} {
			if err := os.RemoveAll(filepath.Join(m.dir(target), d)); err != nil {
				return nil, err
			}
		}
	} else {
		if err := os.Mkdir(m.dir(target), 0o700); err != nil {
			return nil, err
		}
		st = &State{Created: time.Now().UTC()}
	}
	// The log starts as the checkpoint's; the one it replaces is kept as
	// an earlier incarnation's (incarnation.go).
	if err := m.beginIncarnation(target, st, man, history, existing != nil); err != nil {
		if existing == nil {
			os.RemoveAll(m.dir(target))
		}
		return nil, fmt.Errorf("restore %s: %w", target, err)
	}
	st.Config = cfg.Config
	st.Config.Name = target
	if opts.Net != nil {
		st.Config.Net = opts.Net
	}
	st.CgroupsPath = "/cairn-" + m.instance + "-" + target
	st.RestoredFrom = man.Name()
	upper := filepath.Join(m.dir(target), "upper")
	fail := func(err error) (*Info, error) {
		if existing == nil {
			_ = m.destroy(context.WithoutCancel(ctx), st)
		} else {
			_ = m.teardown(context.WithoutCancel(ctx), st)
		}
		return nil, err
	}
	if err := os.Rename(newUpper, upper); err != nil {
		return fail(err)
	}
	from := &restoreFrom{images: criuDir, work: workDir, owner: filepath.Join(staging, stagingOwner)}
	if lz != nil {
		from.lazy = lz.daemon
	}
	if err := os.MkdirAll(from.work, 0o700); err != nil {
		return fail(err)
	}
	beforeStart := time.Since(begin)
	if err := m.start(ctx, st, from, cfg.Addr); err != nil {
		return fail(err)
	}
	started := time.Since(begin)
	// CRIU restores the freezer state the dump saw (a checkpoint taken
	// frozen comes back frozen): set the one asked for, without asking
	// runc (a process start) what it is.
	fz, err := freezerFor(st.CgroupsPath)
	if err == nil {
		err = fz.set(ctx, opts.Paused)
	}
	if err != nil {
		return fail(fmt.Errorf("restore %s: set frozen=%v: %w", target, opts.Paused, err))
	}
	if lz != nil {
		lazyStarted = true
		lz.startPrefetch(m.log, man.Name())
		go func() {
			st, err := lz.wait()
			if err != nil {
				if b, rerr := os.ReadFile(filepath.Join(workDir, lazyLog)); rerr == nil {
					_ = os.WriteFile(filepath.Join(m.dir(target), lazyLog), b, 0o600)
				}
				err = fmt.Errorf("%w (CRIU's log: %s)", err, filepath.Join(m.dir(target), lazyLog))
			}
			os.RemoveAll(staging)
			if err != nil {
				m.log.Error("lazy restore failed: the container is killed", "container", target, "ckpt", man.Name(), "err", err)
			} else {
				m.log.Info("lazy restore complete: every page is here", "container", target, "ckpt", man.Name(),
					"pages", st.Pages, "requests", st.Requests, "took", st.Took)
			}
			if opts.Lazy.Done != nil {
				opts.Lazy.Done(st, err)
			}
		}()
	}
	in, err := m.restored(target, st, opts.Paused)
	// Where the time went: reading the image into staging, replacing the
	// old runtime, network and root, runc restore (CRIU within), the rest.
	m.log.Info("restored", "container", target, "ckpt", man.Name(), "lazy", lz != nil, "took", time.Since(begin),
		"stage", stagedAt, "replace", beforeStart-stagedAt, "net_root", started-beforeStart-from.runc, "runc", from.runc,
		"after", time.Since(begin)-started)
	return in, err
}

// Pause freezes a running container and Resume thaws it. A job's ranks,
// restored paused, are resumed together once all are restored. Pause
// freezes on behalf of this process: should it end before Resume, the
// container's watchdog resumes the container and lifts its network lock.
func (m *Manager) Pause(ctx context.Context, name string) error { return m.setFrozen(ctx, name, true) }

// Resume thaws a container frozen by Pause or restored paused.
func (m *Manager) Resume(ctx context.Context, name string) error {
	return m.setFrozen(ctx, name, false)
}

func (m *Manager) setFrozen(ctx context.Context, name string, frozen bool) error {
	st, err := m.loadState(name)
	if err != nil {
		return err
	}
	fz, err := freezerFor(st.CgroupsPath)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	marker := filepath.Join(m.dir(name), freezeMarker)
	if !frozen {
		if err := fz.set(ctx, false); err != nil {
			return err
		}
		if n, err := readFreezeNote(marker); err == nil && n.PID == os.Getpid() {
			os.Remove(marker)
		}
		return nil
	}
	// No dump runs under a pause: the deadline only matters once this
	// process is gone, and then the watchdog resumes the container anyway.
	if err := writeFreezeNote(marker, freezeNote{PID: os.Getpid(), Deadline: time.Now().Unix()}); err != nil {
		return err
	}
	return fz.set(ctx, true)
}

// Checkpoints lists a container's checkpoints, oldest first.
func (m *Manager) Checkpoints(name string) ([]*image.Record, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	ms, errs := m.repo.List(name)
	return ms, errors.Join(errs...)
}

// ParseCheckpointRef splits "name:seq" or "seq" (with defaultName).
func ParseCheckpointRef(ref, defaultName string) (string, int, error) {
	name, seqStr := defaultName, ref
	if i := strings.LastIndexByte(ref, ':'); i >= 0 {
		name, seqStr = ref[:i], ref[i+1:]
	}
	var seq int
	if _, err := fmt.Sscanf(seqStr, "%d", &seq); err != nil || seq <= 0 || fmt.Sprint(seq) != seqStr {
		return "", 0, fmt.Errorf("bad checkpoint %q: want NUMBER or NAME:NUMBER", ref)
	}
	if name != "" {
		if err := ValidName(name); err != nil {
			return "", 0, err
		}
	}
	return name, seq, nil
}

// recoverFreeze releases a container that a checkpoint froze and never
// thawed because the process running it died (see watchdog.go), unless
// this process keeps it frozen on purpose.
func (m *Manager) recoverFreeze(ctx context.Context, st *State, initPID int) {
	if m.holds(st.Config.Name) {
		return // a prepared checkpoint of this process keeps it frozen
	}
	ok, err := releaseAbandoned(ctx, m.watchTarget(st), initPID, time.Now())
	switch {
	case err != nil:
		m.log.Warn("release a container an interrupted checkpoint left frozen", "container", st.Config.Name, "err", err)
	case ok:
		m.log.Warn("released a container an interrupted checkpoint left frozen", "container", st.Config.Name)
	}
}

// watchTarget is what a watchdog needs to release st's container.
func (m *Manager) watchTarget(st *State) watchTarget {
	netns := ""
	if st.Config.Net != nil {
		netns = st.Config.Net.Netns
	} else if st.Endpoint.Netns != "" {
		netns = netw.NetnsPath(st.Endpoint.Netns)
	}
	return watchTarget{
		Marker:   filepath.Join(m.dir(st.Config.Name), freezeMarker),
		Cgroups:  st.CgroupsPath,
		Netns:    netns,
		RuncRoot: m.runc.root,
		ID:       m.runcID(st.Config.Name),
	}
}

// stagingOwner is the file in a staging dir that lists the pids using it.
const stagingOwner = "owner"

// cleanStaging removes staging dirs that checkpoints of processes that no
// longer exist left behind: they may hold a whole memory image in tmpfs. A
// dir is kept while any process its owner file names still runs: an
// orphaned runc and CRIU may still be dumping into it.
func (m *Manager) cleanStaging() {
	ents, _ := os.ReadDir(m.opts.StagingDir)
	for _, e := range ents {
		i := strings.Index(e.Name(), "-pid")
		if i < 0 {
			continue
		}
		dir := filepath.Join(m.opts.StagingDir, e.Name())
		owners := []string{strings.SplitN(e.Name()[i+4:], "-", 2)[0]}
		if b, err := os.ReadFile(filepath.Join(dir, stagingOwner)); err == nil {
			owners = append(owners, strings.Fields(string(b))...)
		}
		live := false
		for _, o := range owners {
			if pid, err := strconv.Atoi(o); err != nil || pid == os.Getpid() || processRuns(pid) {
				live = true // unparsable: leave it alone
			}
		}
		if !live {
			os.RemoveAll(dir)
		}
	}
}
