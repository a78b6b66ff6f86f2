package container

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"

	"cairn/internal/criu"
	"cairn/internal/image"
	"cairn/internal/netw"
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
	nftLock bool

	heldMu sync.Mutex
	held   map[string]bool // containers this process keeps frozen on purpose

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
			Dir:      filepath.Join(opts.DataDir, "checkpoints"),
			StoreDir: filepath.Join(opts.DataDir, "store"),
			Logger:   opts.Logger,
		},
		ipam: netw.IPAM{Path: netw.DefaultStatePath(opts.DataDir), Subnet: opts.Bridge.Subnet},
		log:  opts.Logger,
	}
	if opts.CRIU != "" || os.Getenv(criu.EnvPath) != "" {
		m.runc.criu, _ = criu.Find(opts.CRIU)
	} else if p, err := criu.Find(""); err == nil {
		m.runc.criu = p
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

// shmSize is the size of a container's /dev/shm tmpfs (spec.go mounts it
// with size=262144k).
const shmSize = 256 << 20

// irmapScan are the directories of a container's root where CRIU looks
// for the files that inotify watches are on, in this order, after its own
// few hints (/etc, /var/log, ...). "/." is the whole root, scanned last.
var irmapScan = []string{"/tmp", "/var/tmp", "/root", "/home", "/srv", "/opt", "/mnt", "/."}

// criuConfig is the CRIU config file runc passes to every dump and restore
// of a container. It replaces runc's default (/etc/criu/runc.conf), so that
// a host-wide file does not change cairn's dumps. runc sets CRIU's options
// through RPC, and CRIU applies the config file after them, so what is
// here holds whatever runc's flags say.
//
//   - file-locks: flock, POSIX and OFD locks (HDF5, sqlite) are dumped and
//     taken again at restore; without it CRIU refuses to dump a process
//     that holds one.
//   - ghost-limit: CRIU keeps the content of files that are open but
//     unlinked ("ghost" files) in the image, up to 1 MiB each by default;
//     MPI transports (UCX under MPICH) keep larger ones in /dev/shm. The
//     limit is the size of /dev/shm, the most such a file there can hold.
//   - irmap-scan-path: CRIU records an inotify watch by the path of the
//     file it is on, found from the file handle the kernel gives for it;
//     an overlay (without nfs_export) cannot open its handles, so CRIU
//     walks directories for an inode of that number instead. It does so
//     only for a process that has a watch; the walk stalls the container
//     (docs/architecture.md, "Known limits").
//   - network-lock nftables, where CRIU can: the iptables method runs
//     iptables-restore, and with Debian 12's nft-backed iptables the unlock
//     alone stalls the container for about 70 ms per checkpoint.
func (m *Manager) criuConfig(ctx context.Context) []byte {
	m.nftOnce.Do(func() {
		path, err := criu.Find(m.opts.CRIU)
		if err != nil {
			return
		}
		m.nftLock = exec.CommandContext(ctx, path, "check", "--feature", "network_lock_nftables").Run() == nil
	})
	conf := fmt.Sprintf("file-locks\nghost-limit %d\n", shmSize)
	for _, d := range irmapScan {
		conf += "irmap-scan-path " + d + "\n"
	}
	if m.nftLock {
		return []byte(conf + "network-lock nftables\n")
	}
	return []byte(conf + "# network-lock: CRIU's default (iptables)\n")
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

func (m *Manager) endpoint(name string, addr netip.Addr) netw.Endpoint {
	h := blake3.Sum256([]byte(m.instance + "/" + name))
	return netw.Endpoint{
		Netns:  "cairn-" + m.instance + "-" + name,
		Veth:   "c" + m.instance + hex.EncodeToString(h[:3]), // 15 bytes, the most a link name may have
		Addr:   addr,
		Bridge: m.opts.Bridge,
	}
}

func (m *Manager) runcID(name string) string { return name }

// Run creates and starts a container. On error nothing of it is left.
func (m *Manager) Run(ctx context.Context, cfg Config) (*Info, error) {
	if err := ValidName(cfg.Name); err != nil {
		return nil, err
	}
	if len(cfg.Args) == 0 {
		return nil, errors.New("no command given")
	}
	if cfg.Hostname == "" {
		cfg.Hostname = cfg.Name
	}
	if cfg.RootFS != "" {
		abs, err := filepath.Abs(cfg.RootFS)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("rootfs %s is not a directory", cfg.RootFS)
		}
		cfg.RootFS = abs
	}
	if err := m.checkVolumes(cfg.Volumes); err != nil {
		return nil, err
	}
	if cfg.CPUs < 0 || cfg.Memory < 0 || cfg.Memory > 0 && cfg.Memory < 4<<20 {
		return nil, fmt.Errorf("%w: cpus %g, memory %d bytes: want positive limits, memory at least 4 MiB", ErrBadConfig, cfg.CPUs, cfg.Memory)
	}
	unlock, err := m.lock(cfg.Name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := os.Mkdir(m.dir(cfg.Name), 0o700); err != nil {
		if os.IsExist(err) {
			return nil, fmt.Errorf("%w: %s", ErrExists, cfg.Name)
		}
		return nil, err
	}
	st := &State{Config: cfg, Created: time.Now().UTC(), CgroupsPath: "/cairn-" + m.instance + "-" + cfg.Name}
	if err := m.saveState(st); err != nil {
		os.RemoveAll(m.dir(cfg.Name))
		return nil, err
	}
	if err := m.start(ctx, st, nil, ""); err != nil {
		_ = m.destroy(context.WithoutCancel(ctx), st)
		return nil, err
	}
	return m.Get(ctx, cfg.Name)
}

// restoreFrom names a staged CRIU image and its work dir for start, and the
// owner file of their staging dir (see cleanStaging).
type restoreFrom struct {
	images, work, owner string
	lazy                []string // argv of the lazy-pages daemon that serves the memory (lazy.go)
	// runc is set by start: how long the shim took to start runc
	// restore and see it return (CRIU's restore within it).
	runc time.Duration
}

// start sets up the network and overlay of st (whose fs delta, if any, is
// already in its upper dir) and starts it with a shim, fresh or from a
// CRIU image. It records the addresses and the shim in st.
func (m *Manager) start(ctx context.Context, st *State, from *restoreFrom, wantAddr string) error {
	name := st.Config.Name
	dir := m.dir(name)
	netnsPath, err := m.network(ctx, st, wantAddr)
	if err != nil {
		return err
	}
	if from == nil {
		// A fresh start: the container's own hosts file, before the root
		// is mounted (a restore brings back the one it had).
		if err := os.MkdirAll(filepath.Join(dir, "upper"), 0o755); err != nil {
			return err
		}
		if err := writeHosts(st, filepath.Join(dir, "upper")); err != nil {
			return err
		}
	}
	if err := m.mountRoot(st); err != nil {
		return err
	}
	criuConf := filepath.Join(dir, "criu.conf")
	if err := os.WriteFile(criuConf, m.criuConfig(ctx), 0o600); err != nil {
		return err
	}
	if err := writeSpec(st, dir, m.rootPath(st), netnsPath, criuConf); err != nil {
		return err
	}
	os.Remove(filepath.Join(dir, "exit.json"))
	os.Remove(filepath.Join(dir, "runc.log"))
	runcLog := filepath.Join(dir, "runc.log")
	pidFile := filepath.Join(dir, "init.pid")
	os.Remove(pidFile)
	var args []string
	if from == nil {
		args = m.runc.argv(runcLog, "run", "-d", "--bundle", dir, "--pid-file", pidFile, m.runcID(name))
	} else {
		args = m.runc.argv(runcLog, "restore", "-d", "--tcp-established",
			"--image-path", from.images, "--work-path", from.work,
			"--bundle", dir, "--pid-file", pidFile)
		if len(from.lazy) > 0 {
			args = append(args, "--lazy-pages")
		}
		args = append(args, m.runcID(name))
	}
	watch := m.watchTarget(st)
	var started func(int)
	removeAfter := ""
	if from != nil && from.owner != "" {
		removeAfter = from.images // the big part; the logs in work stay for errors
		// The shim runs runc restore, which reads the staged image: if this
		// process dies meanwhile, cleanStaging must wait for the shim.
		started = func(pid int) {
			_ = os.WriteFile(from.owner, []byte(fmt.Sprintf("%d %d", os.Getpid(), pid)), 0o600)
		}
	}
	spec := shimSpec{
		Runc: args, Env: m.runc.env(), PidFile: pidFile, RuncLog: runcLog,
		LogPath:     filepath.Join(dir, logName),
		Control:     filepath.Join(dir, shimSocket),
		ExitPath:    filepath.Join(dir, "exit.json"),
		RemoveAfter: removeAfter,
		Watch:       &watch,
	}
	if from != nil {
		spec.Lazy = from.lazy
	}
	t := time.Now()
	shimPID, _, err := m.startShim(spec, started)
	if from != nil {
		from.runc = time.Since(t)
	}
	st.ShimPID = shimPID
	if err != nil {
		if from != nil {
			if b, rerr := os.ReadFile(filepath.Join(from.work, "restore.log")); rerr == nil {
				_ = os.WriteFile(filepath.Join(dir, "restore.log"), b, 0o600)
				if e := criu.LastErrors(b, 3); e != "" {
					return fmt.Errorf("restore %s: %v (CRIU: %s; full log: %s)", name, err, e, filepath.Join(dir, "restore.log"))
				}
			}
			return fmt.Errorf("restore %s: %w", name, err)
		}
		return fmt.Errorf("start %s: %w", name, err)
	}
	st.Started = time.Now().UTC()
	st.Checkpointed = false
	return m.saveState(st)
}

// network gives st its network and returns the path of its netns: the
// namespace named by st.Config.Net, or an endpoint of its own on the node
// bridge, preferably with address wantAddr.
func (m *Manager) network(ctx context.Context, st *State, wantAddr string) (string, error) {
	name := st.Config.Name
	if n := st.Config.Net; n != nil {
		if _, err := os.Stat(n.Netns); err != nil {
			return "", fmt.Errorf("network of %s: %w", name, err)
		}
		st.Addr, st.Endpoint = n.Addr, netw.Endpoint{}
		return n.Netns, m.saveState(st)
	}
	var want netip.Addr
	var loAddrs []netip.Addr
	if wantAddr != "" {
		a, err := netip.ParseAddr(wantAddr)
		if err != nil {
			return "", err
		}
		owner, err := m.ipam.Owner(a)
		if err != nil {
			return "", err
		}
		if owner == "" || owner == name {
			want = a
		} else {
			// A clone restored while the original holds the address: it gets
			// an address of its own, and the old one on lo only.
			loAddrs = []netip.Addr{a}
		}
	}
	addr, err := m.ipam.Allocate(name, want)
	if err != nil {
		return "", err
	}
	st.Addr = addr
	st.Endpoint = m.endpoint(name, addr)
	st.Endpoint.LoAddrs = loAddrs
	if err := m.saveState(st); err != nil {
		return "", err
	}
	if err := m.opts.Bridge.EnsureGuarded(ctx); err != nil {
		return "", fmt.Errorf("node bridge: %w", err)
	}
	if err := st.Endpoint.Create(ctx); err != nil {
		return "", fmt.Errorf("container network: %w", err)
	}
	return st.Endpoint.Path(), nil
}

// usernsRoots holds the root mounts of --userns containers: their root
// (a host uid of its own) must be able to reach its root, which it could
// not inside the data dir (0700). The dir is 0711: nobody can list it.
const usernsRoots = "/run/cairn-roots"

// rootPath is where st's container's root is mounted.
func (m *Manager) rootPath(st *State) string {
	if st.Config.UserNS {
		return filepath.Join(usernsRoots, "cairn-"+m.instance+"-"+st.Config.Name)
	}
	return filepath.Join(m.dir(st.Config.Name), "rootfs")
}

func (m *Manager) mountRoot(st *State) error {
	dir := m.dir(st.Config.Name)
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	root := m.rootPath(st)
	if st.Config.UserNS {
		if err := os.MkdirAll(usernsRoots, 0o711); err != nil {
			return err
		}
		if err := os.Chmod(usernsRoots, 0o711); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	lower := st.Config.RootFS
	if lower == "" {
		lower = "/"
	}
	hidden, err := hiddenPaths(lower, append([]string{m.opts.DataDir, m.opts.StagingDir, DefaultDataDir}, m.opts.Hide...))
	if err == nil {
		err = maskUpper(filepath.Join(dir, "upper"), lower, hidden)
	}
	if err != nil {
		return fmt.Errorf("root of %s: %w", st.Config.Name, err)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay root of %s: %w", st.Config.Name, err)
	}
	return nil
}

// teardown stops whatever runs of st and removes its runtime pieces (runc
// state, overlay mount, network), keeping its directory and files.
func (m *Manager) teardown(ctx context.Context, st *State) error {
	var errs []error
	name := st.Config.Name
	m.killOrphans(name)
	if rs, err := m.runc.state(ctx, m.runcID(name)); err == nil {
		if rs.Status != "stopped" {
			_ = m.runc.run(ctx, "", "kill", m.runcID(name), "KILL")
		}
		m.waitShim(st, 10*time.Second)
		if err := m.runc.run(ctx, "", "delete", "-f", m.runcID(name)); err != nil {
			errs = append(errs, err)
		}
	}
	m.waitShim(st, 5*time.Second)
	rootfs := m.rootPath(st)
	if err := unix.Unmount(rootfs, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		if err := unix.Unmount(rootfs, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", rootfs, err))
		}
	}
	if st.Config.UserNS {
		_ = os.Remove(rootfs) // the empty mount point
	}
	if st.Endpoint.Netns != "" {
		if err := st.Endpoint.Delete(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// destroy tears st down and removes every trace of it but its checkpoints.
func (m *Manager) destroy(ctx context.Context, st *State) error {
	err := m.teardown(ctx, st)
	if rerr := m.ipam.Release(st.Config.Name); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return err
	}
	return os.RemoveAll(m.dir(st.Config.Name))
}

// orphans returns the runc processes still checkpointing or restoring the
// container for a cairn command that was killed, and their children (CRIU).
func (m *Manager) orphans(name string) (runcs []int, children []int) {
	return findOrphans(m.runc.root, m.runcID(name))
}

// findOrphans returns the runc processes of state root root checkpointing
// or restoring container id, and their children (CRIU).
func findOrphans(root, id string) (runcs []int, children []int) {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || !processRuns(pid) {
			continue
		}
		b, err := os.ReadFile(p + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 3 && slices.Contains(args, root) && args[len(args)-1] == id &&
			(slices.Contains(args, "checkpoint") || slices.Contains(args, "restore")) {
			runcs = append(runcs, pid)
		}
	}
	return runcs, childrenOf(runcs...)
}

// childrenOf returns the live children of the given processes.
func childrenOf(parents ...int) []int {
	if len(parents) == 0 {
		return nil
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil && slices.Contains(parents, ppid) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out = append(out, pid)
		}
	}
	return out
}

// waitOrphans waits up to d for orphaned runc processes of the container to
// finish: a new checkpoint must not freeze the container under a dump that
// is still running, or that dump's parasite freezes with it and never
// answers.
func (m *Manager) waitOrphans(name string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		runcs, _ := m.orphans(name)
		if len(runcs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("a checkpoint of %s from a cairn command that was killed is still running (runc pid %v); try again later", name, runcs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killOrphans ends runc processes (and their CRIU children) still working
// on the container for a cairn command that was killed: a container being
// removed must not stay traced by an orphaned dump.
func (m *Manager) killOrphans(name string) {
	runcs, children := m.orphans(name)
	for _, c := range children {
		_ = syscall.Kill(c, syscall.SIGKILL) // CRIU first: it holds the tracees
	}
	for _, r := range runcs {
		_ = syscall.Kill(r, syscall.SIGKILL)
		m.log.Warn("killed an orphaned runc of an interrupted command", "container", name, "pid", r)
	}
}

// waitShim waits up to d for the container's shim to exit.
func (m *Manager) waitShim(st *State, d time.Duration) {
	if st.ShimPID <= 0 {
		return
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !processRuns(st.ShimPID) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// shimRuns reports whether pid is a live shim (its environment names it).
func shimRuns(pid int) bool {
	if pid <= 0 || !processRuns(pid) {
		return false
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	return err == nil && bytes.Contains(env, []byte(ShimEnv+"="))
}

// processRuns reports whether pid is alive and not a zombie.
func processRuns(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// Info is a container's state as shown to users.
type Info struct {
	State
	Name   string `json:"name"`
	Status string `json:"status"` // running, paused, exited, checkpointed, created, stopped
	Pid    int    `json:"pid,omitempty"`
	Exit   *Exit  `json:"exit,omitempty"`
	Dir    string `json:"dir"`
	RootFS string `json:"rootfs_path"`
	Log    string `json:"log_path"`
}

// Config returns the configuration a container was run with, without
// asking runc anything: cheap enough for the hot path of a checkpoint.
func (m *Manager) Config(name string) (Config, error) {
	st, err := m.loadState(name)
	if err != nil {
		return Config{}, err
	}
	return st.Config, nil
}

// info is what Info says of a container without its status.
func (m *Manager) info(name string, st *State) *Info {
	dir := m.dir(name)
	return &Info{State: *st, Name: name, Dir: dir, RootFS: m.rootPath(st), Log: filepath.Join(dir, logName)}
}

// Get returns a container's current state.
func (m *Manager) Get(ctx context.Context, name string) (*Info, error) {
	st, err := m.loadState(name)
	if err != nil {
		return nil, err
	}
	dir := m.dir(name)
	in := m.info(name, st)
	rs, err := m.runc.state(ctx, m.runcID(name))
	if err == nil && rs.Status == "paused" {
		m.recoverFreeze(ctx, st, rs.Pid)
		rs, err = m.runc.state(ctx, m.runcID(name))
	}
	switch {
	case err == nil && rs.Status != "stopped":
		in.Status, in.Pid = rs.Status, rs.Pid
		return in, nil
	case err != nil && !errors.Is(err, errNoRuncContainer):
		return nil, err
	}
	in.Status = "stopped"
	if e, err := readExit(dir); err == nil {
		in.Exit = e
		in.Status = "exited"
	} else if shimRuns(st.ShimPID) {
		// The init is gone but its shim is still draining the output and
		// writing exit.json: not stopped, about to be exited.
		in.Status = "exiting"
	}
	if st.Checkpointed {
		in.Status = "checkpointed"
	}
	return in, nil
}

// List returns every container of the data dir, by name.
func (m *Manager) List(ctx context.Context) ([]*Info, error) {
	ents, err := os.ReadDir(filepath.Join(m.opts.DataDir, "containers"))
	if err != nil {
		return nil, err
	}
	var out []*Info
	for _, e := range ents {
		in, err := m.Get(ctx, e.Name())
		if errors.Is(err, ErrNotFound) {
			continue // being created or removed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Kill sends sig to the container's init (SIGKILL ends the container).
func (m *Manager) Kill(ctx context.Context, name string, sig syscall.Signal) error {
	in, err := m.Get(ctx, name)
	if err != nil {
		return err
	}
	if in.Status != "running" && in.Status != "paused" && in.Status != "created" {
		return fmt.Errorf("%w: %s is %s", ErrNotRunning, name, in.Status)
	}
	if err := m.runc.run(ctx, "", "kill", m.runcID(name), fmt.Sprint(int(sig))); err != nil {
		return err
	}
	if sig == syscall.SIGKILL {
		m.waitShim(&in.State, 10*time.Second)
	}
	return nil
}

// Wait blocks until the container is no longer running and returns how it
// ended.
func (m *Manager) Wait(ctx context.Context, name string) (*Info, error) {
	for {
		in, err := m.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		if in.Status != "running" && in.Status != "paused" && in.Status != "created" {
			m.waitShim(&in.State, 5*time.Second)
			return m.Get(ctx, name)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Remove deletes a container. A running one is refused unless force, which
// kills it first. Its checkpoints are kept.
func (m *Manager) Remove(ctx context.Context, name string, force bool) error {
	unlock, err := m.lock(name)
	if err != nil {
		return err
	}
	defer unlock()
	in, err := m.Get(ctx, name)
	if err != nil {
		return err
	}
	if (in.Status == "running" || in.Status == "paused") && !force {
		return fmt.Errorf("%w: %s (use --force to kill and remove it)", ErrRunning, name)
	}
	if err := m.destroy(ctx, &in.State); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return m.dropKept(name)
}

// ErrUserNSExec is returned by Exec for a --userns container: runc joins
// its user namespace before its network namespace, which belongs to the
// host's user namespace, and the kernel refuses that.
var ErrUserNSExec = errors.New("exec into a container with a user namespace of its own (--userns) is not supported: its network namespace belongs to the host's user namespace")

// Exec runs a command inside a running container with the given stdio and
// returns its exit code.
func (m *Manager) Exec(ctx context.Context, name string, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	in, err := m.Get(ctx, name)
	if err != nil {
		return -1, err
	}
	if in.Status != "running" {
		return -1, fmt.Errorf("%w: %s is %s", ErrNotRunning, name, in.Status)
	}
	if in.Config.UserNS {
		return -1, fmt.Errorf("exec in %s: %w", name, ErrUserNSExec)
	}
	a := m.runc.argv("", append([]string{"exec", m.runcID(name)}, args...)...)
	cmd := exec.CommandContext(ctx, a[0], a[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return -1, fmt.Errorf("exec in %s: %w", name, err)
	}
	return 0, nil
}
