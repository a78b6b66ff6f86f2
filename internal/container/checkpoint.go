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
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/criu"
	"github.com/cairn-hpc/cairn/internal/failpoint"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/netw"
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
	// FilesOnly takes a files-only checkpoint (PrepareOptions.FilesOnly);
	// it cannot Stop the container.
	FilesOnly bool
	// MemoryWait is PrepareOptions.MemoryWait.
	MemoryWait time.Duration
}

// PrepareOptions tunes Prepare.
type PrepareOptions struct {
	// FilesOnly captures the container's written files and its output,
	// never its processes, and runs no CRIU: an application-level
	// checkpoint, whose processes saved what they need into their files
	// before. The container is frozen while its files are captured, as
	// for any checkpoint, and its image is recorded as files-only
	// (image.Record.FilesOnly): a restore starts its command afresh on
	// them. Containers exec'd into, and ones with a user namespace of
	// their own, can be checkpointed so.
	FilesOnly bool
	// MemoryWait bounds the wait for the memory of a container whose
	// lazy restore is still going on (AwaitMemory; 0:
	// DefaultMemoryWait): a checkpoint never dumps memory that has not
	// arrived, and fails with ErrMemoryIncomplete if it is not all
	// there in time.
	MemoryWait time.Duration
}

// imageConfig is the container config recorded in an image.
type imageConfig struct {
	Config
	Addr string `json:"addr"`
}

// RankImage says whether an image is of a rank of a job (its container was
// attached to a job network): a cluster's, which its coordinator's
// retention removes, not a node's gc. A record whose config does not
// parse is taken for one: kept rather than lost.
func RankImage(rec *image.Record) bool {
	var cfg imageConfig
	if err := json.Unmarshal(rec.Config, &cfg); err != nil {
		return true
	}
	return cfg.Net != nil
}

// Checkpoint captures a running container: its processes with CRIU and its
// fs delta (only the fs delta, opts.FilesOnly). The container is paused
// (frozen) for the capture and resumed as soon as its state is in
// staging; the image is persisted after that. On any error the container
// is resumed and no image is listed.
func (m *Manager) Checkpoint(ctx context.Context, name string, opts CheckpointOptions) (*image.Record, error) {
	p, err := m.prepare(ctx, name, 0, opts.Stop, PrepareOptions{FilesOnly: opts.FilesOnly, MemoryWait: opts.MemoryWait})
	if err != nil {
		return nil, err
	}
	return p.Commit(ctx, opts.Progress)
}

// Prepare freezes a running container and captures it (fs delta, then
// processes with CRIU, then output) into staging, leaving it frozen: the
// prepare phase of a global checkpoint. seq is the checkpoint's number
// (0: the next free one); a checkpoint of that number must not exist. On
// error the container is thawed and nothing is kept. opts, at most one,
// may ask for a files-only checkpoint (PrepareOptions.FilesOnly).
func (m *Manager) Prepare(ctx context.Context, name string, seq int, opts ...PrepareOptions) (*Prepared, error) {
	var o PrepareOptions
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		return nil, fmt.Errorf("prepare %s: %d PrepareOptions, want at most one", name, len(opts))
	}
	return m.prepare(ctx, name, seq, false, o)
}

func (m *Manager) prepare(ctx context.Context, name string, seq int, stop bool, o PrepareOptions) (_ *Prepared, err error) {
	filesOnly := o.FilesOnly
	if seq < 0 {
		return nil, fmt.Errorf("%w: checkpoint number %d", names.ErrInvalid, seq)
	}
	if stop && filesOnly {
		return nil, fmt.Errorf("checkpoint %s: a files-only checkpoint cannot stop the container: kill it once the checkpoint is taken", name)
	}
	var info criu.Info
	if !filesOnly {
		if info, err = m.CRIU(ctx); err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", name, err)
		}
		// Before the lock and the freeze: the container runs on while
		// its memory arrives.
		if _, err = m.AwaitMemory(ctx, name, o.MemoryWait); err != nil {
			return nil, err
		}
	}
	unlock, err := m.lock(name)
	if err != nil {
		return nil, err
	}
	p := &Prepared{m: m, name: name, unlock: unlock}
	defer func() {
		if err == nil {
			return
		}
		// The checkpoint's error is returned; a failure to thaw after it
		// is handled here.
		if rerr := p.release(context.WithoutCancel(ctx)); rerr != nil {
			m.log.Warn("resume after a failed checkpoint", "rank", name, "err", rerr)
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
	if in.Status != StatusRunning && in.Status != StatusPaused {
		return nil, fmt.Errorf("%w: %s is %s", ErrNotRunning, name, in.Status)
	}
	st := &in.State
	if st.Config.UserNS && !filesOnly {
		return nil, fmt.Errorf("checkpoint %s: %w", name, ErrUserNSCheckpoint)
	}
	if !filesOnly {
		// CRIU reads it at the dump: what this CRIU supports, asked
		// before the container is frozen (criuconf.go).
		if _, err := m.writeCRIUConfig(ctx, name, true); err != nil {
			return nil, err
		}
	}
	if seq == 0 {
		seq = m.repo.NextSeq(name)
	} else if _, err := m.repo.Load(name, seq); err == nil {
		return nil, fmt.Errorf("%w: checkpoint %s:%d", ErrExists, name, seq)
	}
	p.seq = seq
	if _, err := m.StagingRoot(); err != nil {
		return nil, err
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
	// Before the freeze, which shows a stopped task as sleeping (D).
	if stopped := p.fz.stoppedTasks(); len(stopped) > 0 && !filesOnly {
		return nil, fmt.Errorf("checkpoint %s: %w: %s; continue it (kill -CONT) or end it, and checkpoint again",
			name, ErrStoppedProcesses, strings.Join(stopped, ", "))
	}
	failpoint.Hold(ctx, "before-freeze", m.log)
	var timing image.Timing
	p.start = time.Now()
	wasPaused := in.Status == StatusPaused
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
		// CRIU cannot seize a vfork's parent; files need no such wait.
		if !filesOnly {
			if ok, err := p.fz.settleVfork(ctx); err != nil {
				return nil, fmt.Errorf("checkpoint %s: freeze: %w", name, err)
			} else if !ok {
				m.log.Warn("a process still waits for a vfork child; dumping anyway", "rank", name)
			}
		}
	}
	// Frozen, the container starts nothing new: what exec started is all
	// there is (and a files-only checkpoint does not care).
	if !filesOnly {
		if execd, err := execProcesses(p.fz, in.Pid); err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", name, err)
		} else if len(execd) > 0 {
			return nil, fmt.Errorf("checkpoint %s: %w: %s; end them and checkpoint again", name, ErrExecProcesses, strings.Join(execd, ", "))
		}

	}
	// Whatever path led here, no memory that has not arrived is dumped
	// (memory.go). The kernel is asked while the fs delta is captured:
	// reading smaps takes about 16 ms a GiB of the container's memory.
	memory := make(chan error, 1)
	if !filesOnly {
		go func() { memory <- memoryComplete(name, p.fz) }()
	} else {
		memory <- nil
	}

	// 1. The fs delta, while nothing can write to it.
	t := time.Now()
	delta, err := captureDelta(filepath.Join(m.dir(name), "upper"), filepath.Join(p.imgDir, image.DeltaName))
	if err != nil {
		<-memory
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	timing.Capture = time.Since(t)
	if err := <-memory; err != nil {
		return nil, err
	}

	// 2. The processes, unless the application saved its own state.
	if !filesOnly {
		if err := m.dump(ctx, p, st, stop, &timing); err != nil {
			return nil, err
		}
	}

	conf := st.Config
	if !filesOnly {
		// A restore brings back processes that hold their environment
		// in memory; only a files-only image starts its command afresh,
		// with the recorded one.
		conf = conf.recorded()
	}
	cfg, err := json.Marshal(imageConfig{Config: conf, Addr: st.Addr.String()})
	if err != nil {
		return nil, err
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	p.rec = &image.Record{
		Container: name,
		Seq:       seq,
		Created:   p.start.UTC(),
		Kernel:    unix.ByteSliceToString(uts.Release[:]),
		Stopped:   stop,
		FilesOnly: filesOnly,
		Config:    cfg,
		Delta:     delta,
		Timing:    timing,
	}
	if !filesOnly {
		p.rec.CRIUVersion = info.Version.String()
	}
	// The output up to the freeze, with what was still in the pipe
	// (output.go); the processes are still frozen, or gone with stop.
	if p.rec.Log, err = m.keepOutput(ctx, st, p.imgDir, stop); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	p.staged, _ = dirSize(p.imgDir)
	return p, nil
}

// dump dumps the processes of p's container, frozen, with runc checkpoint
// (CRIU) into p's staging dir, leaving them running unless stop. A dump
// that fails because a task could not be seized is tried again.
func (m *Manager) dump(ctx context.Context, p *Prepared, st *State, stop bool, timing *image.Timing) error {
	name := p.name
	workDir := filepath.Join(p.staging, "work")
	owner := filepath.Join(p.staging, stagingOwner)
	if stop {
		st.Checkpointed = true
		if err := m.saveState(st); err != nil {
			return err
		}
	}
	args := []string{"checkpoint", "--tcp-established", "--image-path", filepath.Join(p.imgDir, image.CRIUDir), "--work-path", workDir}
	if !stop {
		args = append(args, "--leave-running")
	}
	t := time.Now()
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
		why := ""
		if dumpErr != nil && attempt < maxDumpAttempts && dumpCtx.Err() == nil {
			why = transientDump(workDir)
			if why == "" && yardVanished(dumpErr) {
				why = "runc met another CRIU's cgroup mount as it went"
			}
		}
		if why == "" {
			break
		}
		// The container is still frozen; an exiting task is a zombie by
		// now, and a vfork pair is let run to the child's exec.
		m.log.Info(why+"; dumping again", "rank", name, "attempt", attempt+1)
		if err := p.resetDumpDirs(workDir); err != nil {
			cancelDump()
			return fmt.Errorf("checkpoint %s: %w", name, err)
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
				m.log.Warn("drop CRIU's network lock after a failed dump", "rank", name, "err", err)
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
			return fmt.Errorf("%w: %s: %w%s; %w: CRIU's parasite is still in pid %d", ErrDumpFailed, name, dumpErr, detail, ErrDamaged, pid)
		}
		return fmt.Errorf("%w: %s: %w%s", ErrDumpFailed, name, dumpErr, detail)
	}
	if stop && p.frozen {
		p.frozen = false // runc removed the container after the dump
		os.Remove(p.marker)
		m.hold(name, false)
	}
	return nil
}

// maxDumpAttempts bounds the dumps of one checkpoint when processes vanish
// under CRIU's seize, its cgroup mounts find the hierarchy busy, or runc
// finds another CRIU's cgroup yard gone (yardVanished).
const maxDumpAttempts = 3

// transientDump says why a failed dump may succeed if tried again, from
// CRIU's log in workDir, or "" if it would not:
//   - CRIU could not stop one of the container's tasks: one that was
//     exiting when the cgroup froze (the freezer does not stop it, and it
//     is gone a moment later), or the parent of a vfork whose child CRIU
//     seized before its exec;
//   - CRIU could not mount a cgroup v1 controller for its dump (EBUSY):
//     another CRIU on the host was mounting or unmounting the same one at
//     that moment (checkpoint-restore/criu#1897), as ranks of several
//     nodes on one host dumping at once do.
func transientDump(workDir string) string {
	b, err := os.ReadFile(filepath.Join(workDir, "dump.log"))
	switch {
	case err != nil:
		return ""
	case bytes.Contains(b, []byte("Unseizable non-zombie")):
		return "CRIU could not seize a task"
	case bytes.Contains(b, []byte("Device or resource busy")) &&
		(bytes.Contains(b, []byte("Unable to create the cgroup")) || bytes.Contains(b, []byte("Can't mount controller"))):
		return "CRIU found a cgroup hierarchy busy"
	}
	return ""
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

// recorded is c as an image records it: without the variables of Env
// that SecretEnv names.
func (c Config) recorded() Config {
	if len(c.SecretEnv) == 0 {
		return c
	}
	c.Env = slices.DeleteFunc(slices.Clone(c.Env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(c.SecretEnv, k)
	})
	c.SecretEnv = nil
	return c
}
