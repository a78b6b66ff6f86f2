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

	"cairn/internal/image"
)

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
	in.Status, in.Pid = StatusRunning, pid
	switch {
	case st.StartPending:
		in.Status = StatusCreated
	case paused:
		in.Status = StatusPaused
	}
	return in, nil
}

// restart starts a container's command afresh on the files of the
// files-only image rec, already in its upper dir (a files-only restore):
// a fresh start, with the image's number in its environment, made but
// not started if st.StartPending. fail undoes what the restore did.
func (m *Manager) restart(ctx context.Context, st *State, rec *image.Record, addr string, begin time.Time, fail func(error) (*Info, error)) (*Info, error) {
	name := st.Config.Name
	if err := m.start(ctx, st, nil, addr); err != nil {
		return fail(fmt.Errorf("restore %s: %w", name, err))
	}
	in, err := m.restored(name, st, st.StartPending)
	m.log.Info("restarted on the files of a files-only checkpoint", "rank", name, "ckpt", rec.Name(),
		"paused", st.StartPending, "took", time.Since(begin))
	return in, err
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
	man := opts.Record
	if man == nil {
		var err error
		if man, err = m.repo.Load(name, seq); err != nil {
			return nil, err
		}
	}
	// The record grants nothing by itself (grants.go): the network and
	// the tools dir are the caller's to give, the rest is checked as Run
	// checks it, before anything is read or changed.
	var cfg imageConfig
	if err := json.Unmarshal(man.Config, &cfg); err != nil {
		return nil, &image.CorruptError{Image: man.Name(), What: "record", Reason: "config: " + err.Error()}
	}
	conf, err := m.restoredConfig(man, cfg.Config, opts)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", name, err)
	}
	// A files-only image runs no CRIU: its command starts afresh.
	switch {
	case man.FilesOnly && opts.Lazy != nil:
		return nil, fmt.Errorf("restore %s: %s is files-only: it has no memory to fetch lazily; restore it from the store", name, man.Name())
	case !man.FilesOnly:
		if _, err := m.CRIU(ctx); err != nil {
			return nil, fmt.Errorf("restore %s: %w", name, err)
		}
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
		if existing.Status.Live() {
			return nil, fmt.Errorf("%w: %s; stop it first (cairn rm -f %s) or restore a copy with --as NEWNAME", ErrRunning, target, target)
		}
	case !errors.Is(err, ErrNotFound):
		return nil, err
	}

	// Read the whole image, verifying every chunk, before touching anything:
	// CRIU's files into staging (tmpfs), the fs delta into a new upper dir
	// on the data disk, renamed into place once the old runtime is gone.
	staging := opts.Staged
	staged := staging != ""
	if !staged {
		if _, err := m.StagingRoot(); err != nil {
			return nil, err
		}
		m.cleanStaging()
		if staging, err = os.MkdirTemp(m.opts.StagingDir, fmt.Sprintf("restore-%s-%d-pid%d-", target, seq, os.Getpid())); err != nil {
			return nil, err
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
			_ = removeDir(m.dir(target))
		}
		return nil, fmt.Errorf("restore %s: %w", target, err)
	}
	st.Config = conf
	st.Config.Name = target
	st.CgroupsPath = "/cairn-" + m.instance + "-" + target
	st.RestoredFrom = man.Name()
	// A files-only image's command starts afresh, told from which
	// checkpoint; left paused, it waits in runc create for Resume.
	st.Restart, st.StartPending = 0, false
	if man.FilesOnly {
		st.Restart, st.StartPending = man.Seq, opts.Paused
	}
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
	if man.FilesOnly {
		return m.restart(ctx, st, man, cfg.Addr, begin, fail)
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
		// Until every page is here, a checkpoint of target waits
		// (memory.go).
		m.trackLazy(target, lz)
		lz.startPrefetch(m.log, man.Name())
		go func() {
			st, err := lz.wait()
			if err != nil {
				if b, rerr := os.ReadFile(filepath.Join(workDir, lazyLog)); rerr == nil {
					_ = os.WriteFile(filepath.Join(m.dir(target), lazyLog), b, 0o600)
				}
				err = fmt.Errorf("%w (CRIU's log: %s)", err, filepath.Join(m.dir(target), lazyLog))
			}
			lz.err = err
			m.untrackLazy(target, lz)
			close(lz.done)
			os.RemoveAll(staging)
			switch {
			case opts.Lazy.Done != nil:
				opts.Lazy.Done(st, err) // the caller handles the outcome
			case err != nil:
				m.log.Error("lazy restore failed: the container is killed", "rank", target, "ckpt", man.Name(), "err", err)
			default:
				m.log.Info("lazy restore complete: every page is here", "rank", target, "ckpt", man.Name(),
					"pages", st.Pages, "requests", st.Requests, "took", st.Took)
			}
		}()
	}
	in, err := m.restored(target, st, opts.Paused)
	// Where the time went: reading the image into staging, replacing the
	// old runtime, network and root, runc restore (CRIU within), the rest.
	m.log.Info("restored", "rank", target, "ckpt", man.Name(), "lazy", lz != nil, "took", time.Since(begin),
		"stage", stagedAt, "replace", beforeStart-stagedAt, "net_root", started-beforeStart-from.runc, "runc", from.runc,
		"after", time.Since(begin)-started)
	return in, err
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
