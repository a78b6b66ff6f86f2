package container

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/criu"
	"github.com/cairn-hpc/cairn/internal/netw"
)

func (m *Manager) endpoint(name string, addr netip.Addr) netw.Endpoint {
	h := blake3.Sum256([]byte(m.instance + "/" + name))
	return netw.Endpoint{
		Netns:  "cairn-" + m.instance + "-" + name,
		Veth:   "c" + m.instance + hex.EncodeToString(h[:3]), // 15 bytes, the most a link name may have
		Addr:   addr,
		Bridge: m.opts.Bridge,
	}
}

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
	if err := checkGrants(cfg); err != nil {
		return nil, err
	}
	if len(cfg.Volumes) > 0 {
		hidden, err := m.hidden()
		if err != nil {
			return nil, err
		}
		if cfg.Volumes, err = checkVolumes(cfg.Volumes, hidden); err != nil {
			return nil, err
		}
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
		_ = removeDir(m.dir(cfg.Name))
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
// CRIU image. A fresh start with st.StartPending makes the container's
// init but leaves its command for Resume to start (runc create). It
// records the addresses and the shim in st.
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
	if err := m.makeAPIDir(st); err != nil {
		return err
	}
	if err := m.mountRoot(st); err != nil {
		return err
	}
	// Only a restore by CRIU asks CRIU what it supports; a checkpoint
	// writes the file again before its dump (criuconf.go).
	criuConf, err := m.writeCRIUConfig(ctx, name, from != nil)
	if err != nil {
		return err
	}
	// runc mounts the volumes from their pins (pin.go), which it no
	// longer needs once it returns.
	pinned, unpin, err := pinVolumes(st.Config.Volumes, dir)
	if err != nil {
		return err
	}
	defer unpin()
	specOf := *st
	specOf.Config.Volumes = pinned
	if err := writeSpec(&specOf, dir, m.rootPath(st), netnsPath, criuConf); err != nil {
		return err
	}
	os.Remove(filepath.Join(dir, "exit.json"))
	os.Remove(filepath.Join(dir, endedByFile))
	os.Remove(filepath.Join(dir, "runc.log"))
	runcLog := filepath.Join(dir, "runc.log")
	pidFile := filepath.Join(dir, "init.pid")
	os.Remove(pidFile)
	var args []string
	switch {
	case from == nil && st.StartPending:
		args = m.runc.argv(runcLog, "create", "--bundle", dir, "--pid-file", pidFile, m.runcID(name))
	case from == nil:
		args = m.runc.argv(runcLog, "run", "-d", "--bundle", dir, "--pid-file", pidFile, m.runcID(name))
	default:
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
	for attempt := 1; err != nil && from == nil && attempt < maxStartAttempts && yardVanished(err); attempt++ {
		m.log.Info("runc met another CRIU's cgroup mount as it went; starting again", "rank", name, "attempt", attempt+1, "err", err)
		time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
		os.Remove(runcLog)
		os.Remove(pidFile)
		shimPID, _, err = m.startShim(spec, started)
	}
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

// maxStartAttempts bounds the starts of a fresh container that met a
// cgroup mount vanishing under runc (yardVanished).
const maxStartAttempts = 3

// yardVanished reports whether runc failed (to start a container, or to
// checkpoint one) because a cgroup v1 mount it found was gone: the yard a
// CRIU on the host (another rank's dump or restore) mounts for a moment,
// for a controller the host has not mounted itself (runc takes in every
// cgroup mount it finds). Nothing was started or dumped: a new try finds
// the host as it is then.
func yardVanished(err error) bool {
	s := err.Error()
	return strings.Contains(s, ".criu.cgyard.") && strings.Contains(s, "no such file or directory")
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
	hidden, err := hiddenPaths(lower, m.hiddenDirs())
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
