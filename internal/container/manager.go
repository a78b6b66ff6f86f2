package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/criu"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/netw"
)

// Defaults for Options.
const (
	DefaultDataDir    = "/var/lib/cairn"
	DefaultStagingDir = "/dev/shm/cairn-staging"
	DefaultBridge     = "cairn0"
	DefaultSubnet     = "10.213.0.0/16"
	// DefaultDumpTimeout is long enough to dump tens of GiB into tmpfs.
	DefaultDumpTimeout = 10 * time.Minute
)

// dumpGrace is how long after its dump timeout an abandoned dump is still
// let run before a watchdog kills it: the time its owner needs to notice
// the timeout itself.
const dumpGrace = 5 * time.Second

// Options configures a Manager.
type Options struct {
	DataDir    string // state, logs, checkpoint images
	StagingDir string // where CRIU dumps before the image is persisted; tmpfs keeps the stall short
	CRIU       string // CRIU binary; "" finds it with criu.Find
	Runc       string // runc binary; "" means runc on PATH
	Bridge     netw.Bridge
	// Hide lists host paths no container sees (besides DataDir, StagingDir,
	// DefaultDataDir and the host's secrets, always hidden): a cluster's
	// credentials, say. See mask.go.
	Hide []string
	// ShimCommand starts a shim: a binary that runs ShimMain when
	// $CAIRN_SHIM_SPEC is set. Default: this executable with "shim".
	ShimCommand []string
	// DumpTimeout bounds a checkpoint's CRIU dump (default
	// DefaultDumpTimeout): a dump still running then is killed and the
	// container thawed.
	DumpTimeout time.Duration
	// KeepImages is how many bytes of staging the newest images of
	// containers may keep after their checkpoints are committed, for a
	// restore on this node that does not read the store (kept.go); 0
	// keeps none.
	KeepImages int64
	Logger     *slog.Logger
}

// Manager creates, checkpoints and restores the containers of one data dir.
// Several Managers (and cairn processes) may work on one data dir at once:
// every change to a container happens under its lock file.
type Manager struct {
	opts     Options
	instance string
	runc     runc
	repo     image.Repo
	ipam     netw.IPAM
	log      *slog.Logger

	nftOnce sync.Once
	nftLock atomic.Bool // set once nftOnce has found CRIU can lock with nftables

	heldMu sync.Mutex
	held   map[string]bool // containers this process keeps frozen on purpose

	lazyMu sync.Mutex
	lazies map[string]*lazyRun // lazy restores still receiving pages, by container (memory.go)

	criuOnce sync.Once
	criuInfo criu.Info
	criuErr  error
}

// New opens (creating if needed) the data dir and returns a Manager.
func New(opts Options) (*Manager, error) {
	if opts.DataDir == "" {
		opts.DataDir = DefaultDataDir
	}
	if opts.StagingDir == "" {
		opts.StagingDir = DefaultStagingDir
	}
	if opts.Runc == "" {
		opts.Runc = "runc"
	}
	if opts.Bridge.Name == "" {
		opts.Bridge.Name = DefaultBridge
	}
	if !opts.Bridge.Subnet.IsValid() {
		opts.Bridge.Subnet = netip.MustParsePrefix(DefaultSubnet)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.DumpTimeout <= 0 {
		opts.DumpTimeout = DefaultDumpTimeout
	}
	if len(opts.ShimCommand) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		opts.ShimCommand = []string{exe, "shim"}
	}
	abs, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, err
	}
	opts.DataDir = abs
	for _, d := range []string{"containers", "checkpoints", "runc", "net", "locks"} {
		if err := os.MkdirAll(filepath.Join(opts.DataDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("create data dir: %w", err)
		}
	}
	inst, err := instanceID(opts.DataDir)
	if err != nil {
		return nil, err
	}
	runcBin, err := exec.LookPath(opts.Runc)
	if err != nil {
		return nil, fmt.Errorf("runc not found (%v); run `make setup`", err)
	}
	m := &Manager{
		opts:     opts,
		instance: inst,
		runc:     runc{bin: runcBin, root: filepath.Join(opts.DataDir, "runc")},
		repo: image.Repo{
			Dir:         filepath.Join(opts.DataDir, "checkpoints"),
			StoreDir:    filepath.Join(opts.DataDir, "store"),
			Logger:      opts.Logger,
			CheckConfig: CheckRecordedConfig,
		},
		ipam: netw.IPAM{Path: netw.DefaultStatePath(opts.DataDir), Subnet: opts.Bridge.Subnet},
		log:  opts.Logger,
	}
	if opts.CRIU != "" || os.Getenv(criu.EnvPath) != "" {
		m.runc.criu, _ = criu.Find(opts.CRIU)
	} else if p, err := criu.Find(""); err == nil {
		m.runc.criu = p
	}
	if err := m.register(); err != nil {
		return nil, fmt.Errorf("list this instance in %s: %w", InstancesDir, err)
	}
	return m, nil
}

// instanceID returns the data dir's random id, creating it once.
func instanceID(dataDir string) (string, error) {
	p := filepath.Join(dataDir, "instance")
	if b, err := os.ReadFile(p); err == nil && len(strings.TrimSpace(string(b))) == 8 {
		return strings.TrimSpace(string(b)), nil
	}
	var r [4]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(r[:])
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return "", err
	}
	if err := os.Link(tmp, p); err != nil && !os.IsExist(err) {
		return "", err
	}
	os.Remove(tmp)
	b, err := os.ReadFile(p)
	return strings.TrimSpace(string(b)), err
}

// Instance returns the data dir's random id, which names the container's
// cgroups (/cairn-ID-NAME), netns (cairn-ID-NAME) and veths (cID...).
func (m *Manager) Instance() string { return m.instance }

// DataDir returns the absolute data dir.
func (m *Manager) DataDir() string { return m.opts.DataDir }

// Repo returns the checkpoint image repository.
func (m *Manager) Repo() image.Repo { return m.repo }

// StagingDir is where images are staged before they are stored or after
// they are read (tmpfs by default).
func (m *Manager) StagingDir() string { return m.opts.StagingDir }

// CRIU checks (once per Manager) that CRIU is usable and returns its info.
func (m *Manager) CRIU(ctx context.Context) (criu.Info, error) {
	m.criuOnce.Do(func() {
		path, err := criu.Find(m.opts.CRIU)
		if err != nil {
			m.criuErr = err
			return
		}
		m.criuInfo, m.criuErr = criu.Check(ctx, path)
		m.runc.criu = path
	})
	return m.criuInfo, m.criuErr
}

// hold records that this process keeps the container frozen (a prepared
// checkpoint), so that recoverFreeze leaves it so.
func (m *Manager) hold(name string, on bool) {
	m.heldMu.Lock()
	defer m.heldMu.Unlock()
	if m.held == nil {
		m.held = map[string]bool{}
	}
	if on {
		m.held[name] = true
	} else {
		delete(m.held, name)
	}
}

func (m *Manager) holds(name string) bool {
	m.heldMu.Lock()
	defer m.heldMu.Unlock()
	return m.held[name]
}

// lock takes the exclusive lock of a container name until unlock is called.
// The lock file goes again at unlock if the name has neither a container
// nor a checkpoint then, so that names asked for in vain leave nothing.
// Whoever waited on a lock file that was removed meanwhile notices and
// locks the new one.
func (m *Manager) lock(name string) (unlock func(), err error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	path := filepath.Join(m.opts.DataDir, "locks", name+".lock")
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock container %s: %w", name, err)
		}
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return func() {
				if !m.exists(name) {
					os.Remove(path)
				}
				f.Close()
			}, nil
		}
		f.Close() // removed or replaced while we waited: lock the current one
	}
}

// exists reports whether name has a container or a checkpoint here.
func (m *Manager) exists(name string) bool {
	if _, err := os.Lstat(m.dir(name)); err == nil {
		return true
	}
	ents, _ := os.ReadDir(filepath.Join(m.repo.Dir, name))
	return len(ents) > 0
}

func (m *Manager) runcID(name string) string { return name }

// Config returns the configuration a container was run with, without
// asking runc anything: cheap enough for the hot path of a checkpoint.
func (m *Manager) Config(name string) (Config, error) {
	st, err := m.loadState(name)
	if err != nil {
		return Config{}, err
	}
	return st.Config, nil
}
