package container

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"cairn/internal/criu"
	"cairn/internal/image"
)

// ErrDumpFailed is returned when CRIU could not dump a container. The
// container keeps running and no checkpoint is listed.
var ErrDumpFailed = errors.New("checkpoint dump failed")

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
	info, err := m.CRIU(ctx)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	unlock, err := m.lock(name)
	if err != nil {
		return nil, err
	}
	defer unlock()
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
	log := m.log.With("container", name)

	seq := m.repo.NextSeq(name)
	if err := os.MkdirAll(m.opts.StagingDir, 0o700); err != nil {
		return nil, fmt.Errorf("staging dir: %w", err)
	}
	m.cleanStaging()
	staging, err := os.MkdirTemp(m.opts.StagingDir, fmt.Sprintf("%s-%d-pid%d-", name, seq, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("staging dir: %w", err)
	}
	defer func() {
		if os.Getenv("CAIRN_KEEP_STAGING") == "" {
			os.RemoveAll(staging)
		}
	}()
	// Who uses this staging dir: this process, and once it runs, runc (with
	// CRIU under it), which outlives this process if it is killed and must
	// not lose its staging dir to cleanStaging.
	owner := filepath.Join(staging, stagingOwner)
	if err := os.WriteFile(owner, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, err
	}
	imgDir := filepath.Join(staging, "image")
	workDir := filepath.Join(staging, "work")
	for _, d := range []string{filepath.Join(imgDir, image.CRIUDir), workDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}

	fz, err := freezerFor(st.CgroupsPath)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	var timing image.Timing
	start := time.Now()
	wasPaused := in.Status == "paused"
	marker := filepath.Join(m.dir(name), freezeMarker)
	if !wasPaused {
		// Say who froze the container, so that if this process dies before
		// thawing it, the next cairn command thaws it (recoverFreeze).
		if err := os.WriteFile(marker, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
			return nil, err
		}
		if err := fz.set(ctx, true); err != nil {
			os.Remove(marker)
			return nil, fmt.Errorf("checkpoint %s: freeze: %w", name, err)
		}
	}
	frozen := true
	resume := func() {
		if frozen && !wasPaused {
			if err := fz.set(context.WithoutCancel(ctx), false); err != nil {
				log.Warn("resume after checkpoint", "err", err)
			}
			os.Remove(marker)
		}
		frozen = false
	}
	defer resume()

	// 1. The fs delta, while nothing can write to it.
	t := time.Now()
	delta, err := captureDelta(filepath.Join(m.dir(name), "upper"), filepath.Join(imgDir, image.DeltaName))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	timing.Capture = time.Since(t)

	// 2. The processes.
	if opts.Stop {
		st.Checkpointed = true
		if err := m.saveState(st); err != nil {
			return nil, err
		}
	}
	args := []string{"checkpoint", "--tcp-established", "--image-path", filepath.Join(imgDir, image.CRIUDir), "--work-path", workDir}
	if !opts.Stop {
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
		if wasPaused {
			return nil
		}
		return os.WriteFile(marker, pids, 0o600)
	}
	dumpErr := m.runc.runNotify(ctx, filepath.Join(m.dir(name), "runc-checkpoint.log"), noteRunc, append(args, m.runcID(name))...)
	timing.Dump = time.Since(t)
	if dumpErr != nil {
		if opts.Stop {
			st.Checkpointed = false
			_ = m.saveState(st)
		}
		detail := ""
		if b, err := os.ReadFile(filepath.Join(workDir, "dump.log")); err == nil {
			keep := filepath.Join(m.dir(name), "dump.log")
			_ = os.WriteFile(keep, b, 0o600)
			detail = fmt.Sprintf(" (CRIU: %s; full log: %s)", criu.LastErrors(b, 3), keep)
		}
		return nil, fmt.Errorf("%w: %s: %v%s", ErrDumpFailed, name, dumpErr, detail)
	}
	if opts.Stop {
		frozen = false // runc removed the container after the dump
		os.Remove(marker)
	} else {
		resume()
	}
	timing.Stall = time.Since(start)

	// 3. Persist, while the container runs on.
	cfg, err := json.Marshal(imageConfig{Config: st.Config, Addr: st.Addr.String()})
	if err != nil {
		return nil, err
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	man := &image.Record{
		Container:   name,
		Seq:         seq,
		Created:     start.UTC(),
		CRIUVersion: info.Version.String(),
		Kernel:      unix.ByteSliceToString(uts.Release[:]),
		Stopped:     opts.Stop,
		Config:      cfg,
		Delta:       delta,
		Timing:      timing,
	}
	t = time.Now()
	if err := m.repo.Ingest(ctx, imgDir, man, opts.Progress); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	// Persist and Total are known only now: they are returned, not stored.
	man.Timing.Persist = time.Since(t)
	man.Timing.Total = time.Since(start)
	log.Info("checkpoint", "ckpt", man.Name(), "stall", man.Timing.Stall, "bytes", man.Size())
	return man, nil
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
}

// Restore brings a container back from one of its checkpoints: the image is
// verified while it is copied to staging (a corrupt or truncated image is
// refused before anything is changed and before CRIU runs), then the
// container gets a fresh overlay holding the checkpoint's fs delta, a fresh
// network namespace with its address, and CRIU restores its processes.
// The container must not be running (use opts.As to restore a copy beside
// it).
func (m *Manager) Restore(ctx context.Context, name string, opts RestoreOptions) (*Info, error) {
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
	if seq == 0 {
		latest, err := m.repo.Latest(name)
		if err != nil {
			return nil, err
		}
		seq = latest.Seq
	}
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
	if err := os.MkdirAll(m.opts.StagingDir, 0o700); err != nil {
		return nil, fmt.Errorf("staging dir: %w", err)
	}
	m.cleanStaging()
	staging, err := os.MkdirTemp(m.opts.StagingDir, fmt.Sprintf("restore-%s-%d-pid%d-", target, seq, os.Getpid()))
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(staging)
	man, err := m.repo.Load(name, seq)
	if err != nil {
		return nil, err
	}
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
	if err := os.Mkdir(criuDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(newUpper, 0o755); err != nil {
		return nil, err
	}
	if err := m.repo.Materialize(ctx, man, criuDir, newUpper, opts.Progress); err != nil {
		return nil, fmt.Errorf("restore %s from %s: %w", target, man.Name(), err)
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
	st.Config = cfg.Config
	st.Config.Name = target
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
	from := &restoreFrom{images: criuDir, work: filepath.Join(staging, "work"), owner: filepath.Join(staging, stagingOwner)}
	if err := os.MkdirAll(from.work, 0o700); err != nil {
		return fail(err)
	}
	if err := m.start(ctx, st, from, cfg.Addr); err != nil {
		return fail(err)
	}
	// CRIU restores the freezer state the dump saw; a checkpoint taken
	// frozen comes back frozen.
	if rs, err := m.runc.state(ctx, m.runcID(target)); err == nil && rs.Status == "paused" {
		fz, err := freezerFor(st.CgroupsPath)
		if err == nil {
			err = fz.set(ctx, false)
		}
		if err != nil {
			return fail(fmt.Errorf("restore %s: thaw: %w", target, err))
		}
	}
	m.log.Info("restored", "container", target, "ckpt", man.Name())
	return m.Get(ctx, target)
}

// Checkpoints lists a container's checkpoints, oldest first.
func (m *Manager) Checkpoints(name string) ([]*image.Record, error) {
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
	return name, seq, nil
}

// freezeMarker is the file in a container's dir that names the process that
// froze it for a checkpoint.
const freezeMarker = "frozen-by"

// recoverFreeze thaws a container that a checkpoint froze and never thawed
// because the cairn process running it died. It waits for CRIU (which may
// still be dumping, orphaned) to let go of the container's init first.
func (m *Manager) recoverFreeze(st *State, initPID int) {
	marker := filepath.Join(m.dir(st.Config.Name), freezeMarker)
	b, err := os.ReadFile(marker)
	if err != nil {
		return
	}
	// "CAIRNPID [RUNCPID]": wait while either still runs.
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() && processRuns(pid) {
			return // the checkpoint is still running
		}
	}
	if initPID > 0 && tracerPID(initPID) != 0 {
		return // an orphaned CRIU still holds the process
	}
	if runcs, _ := m.orphans(st.Config.Name); len(runcs) > 0 {
		return // an orphaned runc is still at work on the container
	}
	fz, err := freezerFor(st.CgroupsPath)
	if err == nil {
		err = fz.set(context.Background(), false)
	}
	if err != nil {
		m.log.Warn("thaw after an interrupted checkpoint", "container", st.Config.Name, "err", err)
		return
	}
	m.log.Warn("thawed a container an interrupted checkpoint left frozen", "container", st.Config.Name)
	os.Remove(marker)
}

// tracerPID returns the pid of the process ptrace-attached to pid, or 0.
func tracerPID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
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
