package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cairn-hpc/cairn/internal/image"
)

// RestoreOptions tunes Restore.
type RestoreOptions struct {
	Seq      int            // checkpoint number; 0 means the newest
	As       string         // restore as a new container of this name
	Progress image.Progress // reports reading the image; may be nil
	// Net replaces the network namespace recorded in the image (a rank
	// restored on another node joins a namespace made there).
	Net *NetAttach
	// Paused leaves the restored processes frozen, for Resume to start
	// them: the ranks of a job are all restored before any runs. A
	// files-only image's container is then made but its command not
	// started (status created) until Resume.
	Paused bool
	// Staged restores from an image staged in this directory (CRIU's
	// files under image.CRIUDir, the fs delta as image.DeltaName, the
	// output as image.LogName, as Prepared.ImageDir leaves them),
	// described by Record, instead of a
	// checkpoint in the store: how a migrated rank is restored without a
	// round trip through the store (a files-only one too: no CRIU files).
	// The directory is used up.
	Staged string
	Record *image.Record
	// Lazy restores from an image this node need not hold, its memory
	// arriving while the processes run (lazy.go). A files-only image,
	// which has no memory, is refused.
	Lazy *Lazy
	// Remote restores eagerly from an image this node need not hold: its
	// files, every page among them, written to staging from Remote's
	// chunks as they come, then restored as one from the store is.
	Remote *Remote
	// Tools is this node's tools dir (Config.Tools), for an image taken
	// with one: the recorded path is never mounted (grants.go), and such
	// an image is refused without it.
	Tools string
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
//
// A files-only image (image.Record.FilesOnly) is restored the same way up
// to the processes: no CRIU runs, and the container's command starts
// afresh on the restored files, with its original Config and
// rankv1.EnvRestart set to the checkpoint's number.
func (m *Manager) Restore(ctx context.Context, name string, opts RestoreOptions) (*Info, error) {
	r, err := planRestore(ctx, m, name, opts)
	if err != nil {
		return nil, err
	}
	unlock, err := m.lock(r.target)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := r.findOld(ctx); err != nil {
		return nil, err
	}
	if err := r.stage(); err != nil {
		return nil, err
	}
	defer r.release()
	if err := r.steps(ctx); err != nil {
		r.undo.run()
		return nil, err
	}
	return r.report()
}

// restore is one call of Restore: what planRestore resolved from its
// options, and what its steps have made so far.
type restore struct {
	m      *Manager
	name   string // the container whose checkpoint is restored
	target string // the container restored: name, or opts.As
	opts   RestoreOptions
	src    imageSource
	rec    *image.Record // the checkpoint's record
	conf   Config        // the config target runs with (restoredConfig)
	addr   string        // the address recorded with the checkpoint
	begin  time.Time

	old     *Info  // target's container before the restore, if there is one
	staging string // the image's staging dir
	// stagingTaken says a lazy restore goes on using the staging dir
	// after Restore returns, and removes it at its end.
	stagingTaken bool
	newUpper     string // the fs delta, until it becomes target's upper dir
	st           *State // target's state, from takeOver on
	undo         undoStack
	took         restoreTimes
}

// restoreTimes say where a restore's time went, each counted from its
// begin: the image was in staging (staged), the old runtime was replaced
// (beforeStart), runc restore had returned (started). runc is the time
// runc restore took, CRIU's restore within it.
type restoreTimes struct {
	staged, beforeStart, started, runc time.Duration
}

// undoStack is what a failed restore undoes, beyond what release removes
// in any case: each step that made something to undo pushes how, and
// run undoes newest first.
type undoStack []func()

func (u *undoStack) push(f func()) { *u = append(*u, f) }

func (u undoStack) run() {
	for i := len(u) - 1; i >= 0; i-- {
		u[i]()
	}
}

// criuDir, workDir and logFile are the image's CRIU files, CRIU's work
// dir and the output kept with the image, in its staging dir.
func (r *restore) criuDir() string { return filepath.Join(r.staging, image.CRIUDir) }
func (r *restore) workDir() string { return filepath.Join(r.staging, "work") }
func (r *restore) logFile() string { return filepath.Join(r.staging, image.LogName) }

// planRestore checks Restore's options and resolves them before anything
// is locked or changed: the names, where the image comes from and its
// record, and the config the container will run with.
func planRestore(ctx context.Context, m *Manager, name string, opts RestoreOptions) (*restore, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	target := name
	if opts.As != "" {
		if err := ValidName(opts.As); err != nil {
			return nil, err
		}
		target = opts.As
	}
	src, rec, err := sourceOf(m, name, opts)
	if err != nil {
		return nil, err
	}
	// The record grants nothing by itself (grants.go): the network and
	// the tools dir are the caller's to give, the rest is checked as Run
	// checks it, before anything is read or changed.
	var cfg imageConfig
	if err := json.Unmarshal(rec.Config, &cfg); err != nil {
		return nil, &image.CorruptError{Image: rec.Name(), What: "record", Reason: "config: " + err.Error()}
	}
	conf, err := m.restoredConfig(rec, cfg.Config, opts)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", name, err)
	}
	// A files-only image runs no CRIU: its command starts afresh.
	switch {
	case rec.FilesOnly && opts.Lazy != nil:
		return nil, fmt.Errorf("restore %s: %s is files-only: it has no memory to fetch lazily; restore it from the store", name, rec.Name())
	case !rec.FilesOnly:
		if _, err := m.CRIU(ctx); err != nil {
			return nil, fmt.Errorf("restore %s: %w", name, err)
		}
	}
	return &restore{m: m, name: name, target: target, opts: opts, src: src, rec: rec,
		conf: conf, addr: cfg.Addr, begin: time.Now()}, nil
}

// findOld finds target's container, if there is one: a restore replaces
// it only if it is not running.
func (r *restore) findOld(ctx context.Context) error {
	old, err := r.m.Get(ctx, r.target)
	switch {
	case err == nil:
		if old.Status.Live() {
			return fmt.Errorf("%w: %s; stop it first (cairn rm -f %s) or restore a copy with --as NEWNAME", ErrRunning, r.target, r.target)
		}
		r.old = old
	case !errors.Is(err, ErrNotFound):
		return err
	}
	return nil
}

// stage gives the image its staging dir (imageSource.stage), which the
// restore uses up: release removes it, or a lazy restore once done.
func (r *restore) stage() error {
	dir, src, err := r.src.stage(r)
	if err != nil {
		return err
	}
	r.staging, r.src = dir, src
	return nil
}

// newStaging makes a staging dir of the restore's own for checkpoint
// seq, first removing those that dead processes left behind.
func (r *restore) newStaging(seq int) (string, error) {
	if _, err := r.m.StagingRoot(); err != nil {
		return "", err
	}
	r.m.cleanStaging()
	return os.MkdirTemp(r.m.opts.StagingDir, fmt.Sprintf("restore-%s-%d-pid%d-", r.target, seq, os.Getpid()))
}

// release removes what a restore used up, whether it succeeded or not:
// the new upper dir if it was not installed, and the staging dir unless
// a lazy restore goes on using it.
func (r *restore) release() {
	if r.newUpper != "" {
		os.RemoveAll(r.newUpper)
	}
	if !r.stagingTaken {
		os.RemoveAll(r.staging)
	}
}

// steps restores the image once it has a staging dir. The whole image is
// read, every chunk verified, before anything of target changes: CRIU's
// files into staging (tmpfs), the fs delta into a new upper dir on the
// data disk, renamed into place once the old runtime is gone. Then the
// processes come back. If a step fails, Restore runs r.undo.
func (r *restore) steps(ctx context.Context) error {
	if err := r.makeUpper(); err != nil {
		return err
	}
	if err := r.src.bringIn(ctx, r); err != nil {
		return err
	}
	r.took.staged = time.Since(r.begin)
	if err := r.takeOver(ctx); err != nil {
		return err
	}
	if err := r.startIncarnation(ctx); err != nil {
		return err
	}
	if err := os.Rename(r.newUpper, filepath.Join(r.m.dir(r.target), "upper")); err != nil {
		return err
	}
	return r.src.revive(ctx, r)
}

// restoreUpperPrefix starts the name of a restore's new upper dir among
// the containers' dirs; no container's name starts with a dot.
const restoreUpperPrefix = ".restore-"

// makeUpper makes the dir the image's fs delta goes into, on the data
// disk beside the containers' dirs (named after the restoring process,
// for cleanStaging to remove it if that process died).
func (r *restore) makeUpper() error {
	dir, err := os.MkdirTemp(filepath.Join(r.m.opts.DataDir, "containers"), fmt.Sprintf("%s%s-pid%d-", restoreUpperPrefix, r.target, os.Getpid()))
	if err != nil {
		return err
	}
	r.newUpper = dir
	return os.Chmod(dir, 0o755)
}

// takeOver replaces the old runtime of target (its processes, overlay
// and network go, its files stay), or makes a new container's dir, and
// sets r.st to target's state.
func (r *restore) takeOver(ctx context.Context) error {
	dir := r.m.dir(r.target)
	if r.old == nil {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return err
		}
		r.st = &State{Created: time.Now().UTC()}
		return nil
	}
	r.st = &r.old.State
	if err := r.m.teardown(ctx, r.st); err != nil {
		return fmt.Errorf("restore %s: clean up old container: %w", r.target, err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.RemoveAll(filepath.Join(dir, d)); err != nil {
			return err
		}
	}
	return nil
}

// startIncarnation starts target's log as the checkpoint's, the one it
// replaces kept as an earlier incarnation's (incarnation.go), and makes
// r.st the restored container's. From here on a failure undoes the
// container (abandon).
func (r *restore) startIncarnation(ctx context.Context) error {
	history := r.logFile()
	if _, err := os.Lstat(history); err != nil {
		history = "" // an image from before the output was kept
	}
	if err := r.m.beginIncarnation(r.target, r.st, r.rec, history, r.old != nil); err != nil {
		if r.old == nil {
			_ = removeDir(r.m.dir(r.target))
		}
		return fmt.Errorf("restore %s: %w", r.target, err)
	}
	st := r.st
	st.Config = r.conf
	st.Config.Name = r.target
	st.CgroupsPath = "/cairn-" + r.m.instance + "-" + r.target
	st.RestoredFrom = r.rec.Name()
	// A files-only image's command starts afresh, told from which
	// checkpoint; left paused, it waits in runc create for Resume.
	st.Restart, st.StartPending = 0, false
	if r.rec.FilesOnly {
		st.Restart, st.StartPending = r.rec.Seq, r.opts.Paused
	}
	r.undo.push(func() { r.abandon(ctx) })
	return nil
}

// abandon undoes the container of a failed restore: a new one is
// removed; one restored in place loses its runtime again, its files
// stay.
func (r *restore) abandon(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	if r.old == nil {
		_ = r.m.destroy(ctx, r.st)
	} else {
		_ = r.m.teardown(ctx, r.st)
	}
}

// criuRestore has CRIU restore the processes from the image in staging
// (with lazyDaemon, the argv of the lazy-pages daemon that serves their
// memory, for a lazy restore) and leaves them frozen or not as
// opts.Paused asks.
func (r *restore) criuRestore(ctx context.Context, lazyDaemon []string) error {
	from := &restoreFrom{images: r.criuDir(), work: r.workDir(), owner: filepath.Join(r.staging, stagingOwner), lazy: lazyDaemon}
	if err := os.MkdirAll(from.work, 0o700); err != nil {
		return err
	}
	r.took.beforeStart = time.Since(r.begin)
	if err := r.m.start(ctx, r.st, from, r.addr); err != nil {
		return err
	}
	r.took.started, r.took.runc = time.Since(r.begin), from.runc
	// CRIU leaves cgroups to runc (criuconf.go; before, it skipped the
	// settings of the cgroups runc had made, the freezer's among them):
	// the processes run once restored, whatever freezer state the dump
	// saw. Set the one asked for, without asking runc (a process start)
	// what it is.
	fz, err := freezerFor(r.st.CgroupsPath)
	if err == nil {
		err = fz.set(ctx, r.opts.Paused)
	}
	if err != nil {
		return fmt.Errorf("restore %s: set frozen=%v: %w", r.target, r.opts.Paused, err)
	}
	return nil
}

// startAfresh starts the command of a files-only image's container
// afresh on the restored files, with the checkpoint's number in its
// environment; made but not started if r.st.StartPending.
func (r *restore) startAfresh(ctx context.Context) error {
	if err := r.m.start(ctx, r.st, nil, r.addr); err != nil {
		return fmt.Errorf("restore %s: %w", r.target, err)
	}
	return nil
}

// report describes the restored container and logs the restore.
func (r *restore) report() (*Info, error) {
	in, err := r.info()
	if r.rec.FilesOnly {
		r.m.log.Info("restarted on the files of a files-only checkpoint", "rank", r.target, "ckpt", r.rec.Name(),
			"paused", r.st.StartPending, "took", time.Since(r.begin))
		return in, err
	}
	// Where the time went: reading the image into staging, replacing the
	// old runtime, network and root, runc restore (CRIU within), the rest.
	_, lazy := r.src.(*lazyImage)
	t := r.took
	r.m.log.Info("restored", "rank", r.target, "ckpt", r.rec.Name(), "lazy", lazy, "took", time.Since(r.begin),
		"stage", t.staged, "replace", t.beforeStart-t.staged, "net_root", t.started-t.beforeStart-t.runc, "runc", t.runc,
		"after", time.Since(r.begin)-t.started)
	return in, err
}

// info describes the container the restore has just started, without
// asking runc (a process start) what the restore knows: created if its
// command waits for Resume, paused if its processes are frozen.
func (r *restore) info() (*Info, error) {
	pid, err := r.initPid()
	if err != nil {
		return nil, err
	}
	in := r.m.info(r.target, r.st)
	in.Status, in.Pid = StatusRunning, pid
	switch {
	case r.st.StartPending:
		in.Status = StatusCreated
	case r.opts.Paused:
		in.Status = StatusPaused
	}
	return in, nil
}

// initPid is the pid of the restored container's init.
func (r *restore) initPid() (int, error) {
	b, err := os.ReadFile(filepath.Join(r.m.dir(r.target), "init.pid"))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("pid file %q: %w", b, err)
	}
	return pid, nil
}

// restoredConfig is the config a container restored from the image man
// runs with: the recorded one, with the network (opts.Net; nil: a
// namespace of the Manager's own, with the recorded address) and the
// tools dir (opts.Tools) given by the caller, never taken from the
// record. What it grants is checked as Run checks it: a record that asks
// for what Run never grants is corrupt (a crafted file); volumes this
// node lacks or hides are ErrBadConfig.
func (m *Manager) restoredConfig(man *image.Record, rec Config, opts RestoreOptions) (Config, error) {
	conf := rec
	conf.Net, conf.Tools = opts.Net, ""
	if rec.Tools != "" {
		if opts.Tools == "" {
			return conf, fmt.Errorf("%w: %s was taken with cairn's tools mounted at %s (a rank of a job): restore it as one, by its job", ErrBadConfig, man.Name(), ToolsMount)
		}
		conf.Tools = opts.Tools
	}
	if err := checkGrants(conf); err != nil {
		return conf, &image.CorruptError{Image: man.Name(), What: "record", Reason: "config: " + err.Error()}
	}
	if conf.RootFS == "" && len(conf.Volumes) == 0 {
		return conf, nil
	}
	hidden, err := m.hidden()
	if err != nil {
		return conf, err
	}
	if conf.RootFS != "" {
		if fi, err := os.Stat(conf.RootFS); err != nil || !fi.IsDir() {
			return conf, fmt.Errorf("%w: rootfs %s of %s is not a directory on this node", ErrBadConfig, conf.RootFS, man.Name())
		}
		if under(conf.RootFS, hidden...) {
			return conf, fmt.Errorf("%w: rootfs %s of %s is in a dir cairn hides from containers", ErrBadConfig, conf.RootFS, man.Name())
		}
	}
	vols, err := checkVolumes(conf.Volumes, hidden)
	conf.Volumes = vols
	return conf, err
}
