package container

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A container's root is an overlay whose lower layer is usually the host's
// own /. What a rank must not see of its host is hidden in the overlay's
// upper dir before the overlay is mounted: a directory becomes an empty
// opaque directory (trusted.overlay.opaque=y), anything else a whiteout.
// The container can write there as anywhere else, into its own upper dir;
// the host's files stay out of sight. This works whatever the lower layer
// is, and costs nothing at run time.

// hostSecrets are host paths hidden from every container (globs, matched
// against the lower layer): credentials of the host and of the services on
// it, and runtime state such as /run/netns and the sockets of daemons. A
// rank's /run is thus its own empty dir, where runc makes the mount point
// of its rank API's dir, the one host dir of cairn's it sees (apidir.go).
var hostSecrets = []string{
	"/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-",
	"/etc/ssh/ssh_host_*_key", "/etc/ssl/private", "/etc/cairn",
	"/root", "/home/*/.ssh", "/home/*/.gnupg",
	"/run", "/var/log", "/var/spool", "/var/backups", "/var/mail",
	"/var/lib/*",
}

// keptUnderVarLib are the entries of /var/lib programs read and that hold
// no secret: the package databases and the machine id's neighbours.
var keptUnderVarLib = []string{"dpkg", "apt", "ucf", "dbus", "misc", "pam", "python", "ca-certificates", "dictionaries-common", "polkit-1", "systemd"}

// hiddenPaths returns the absolute paths under lower to hide: hostSecrets
// that exist, and extra (cairn's own data, staging and the operator's
// Hide list), which are hidden whether or not they exist in lower yet.
func hiddenPaths(lower string, extra []string) ([]string, error) {
	var out []string
	for _, pat := range hostSecrets {
		matches, err := filepath.Glob(filepath.Join(lower, pat))
		if err != nil {
			return nil, err
		}
		for _, m := range matches {
			rel := "/" + strings.TrimPrefix(strings.TrimPrefix(m, lower), "/")
			if dir, base := filepath.Split(rel); dir == "/var/lib/" && slices.Contains(keptUnderVarLib, base) {
				continue
			}
			out = append(out, rel)
		}
	}
	for _, p := range extra {
		if p == "" {
			continue
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, err
		}
		if abs == "/" {
			return nil, errors.New("cannot hide /")
		}
		out = append(out, abs)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	// A path under another hidden one is hidden already; masking it too
	// would make its parents, empty, inside the opaque dir.
	kept := out[:0]
	for _, p := range out {
		if len(kept) == 0 || !strings.HasPrefix(p, strings.TrimSuffix(kept[len(kept)-1], "/")+"/") {
			kept = append(kept, p)
		}
	}
	return kept, nil
}

// maskUpper hides paths (absolute, inside the container) of lower by
// entries in upper, making the parents they need in upper with the mode
// and owner the lower layer gives them (so /var/tmp stays 1777). A path
// the upper dir already holds is left alone: it is the container's own, or
// masked before.
func maskUpper(upper, lower string, paths []string) error {
	for _, p := range paths {
		fi, err := os.Lstat(filepath.Join(lower, p))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("hide %s: %w", p, err)
		}
		if err := mkParents(upper, lower, filepath.Dir(p)); err != nil {
			return fmt.Errorf("hide %s: %w", p, err)
		}
		dst := filepath.Join(upper, p)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		if fi.IsDir() {
			err = mkdirLike(dst, fi)
			if err == nil {
				err = unix.Lsetxattr(dst, "trusted.overlay.opaque", []byte("y"), 0)
			}
		} else {
			err = unix.Mknod(dst, unix.S_IFCHR, 0)
		}
		if err != nil {
			return fmt.Errorf("hide %s: %w", p, err)
		}
	}
	return nil
}

// mkParents makes dir (absolute, inside the container) and its parents in
// upper where missing, each like its counterpart in lower.
func mkParents(upper, lower, dir string) error {
	if dir == "/" {
		return nil
	}
	if _, err := os.Lstat(filepath.Join(upper, dir)); err == nil {
		return nil
	}
	if err := mkParents(upper, lower, filepath.Dir(dir)); err != nil {
		return err
	}
	fi, err := os.Lstat(filepath.Join(lower, dir))
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory in the root", dir)
	}
	return mkdirLike(filepath.Join(upper, dir), fi)
}

// mkdirLike makes dir with fi's permission bits (sticky included) and owner.
func mkdirLike(dir string, fi fs.FileInfo) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := os.Lchown(dir, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		return unix.Chmod(dir, st.Mode&0o7777)
	}
	return os.Chmod(dir, fi.Mode().Perm())
}

// writeHosts gives a container a hosts file of its own in its upper dir:
// localhost and its host name at its address. Without it, the host name
// resolves through DNS, which a container may not reach: MPI launchers
// (hydra) then stall for the lookup's timeout, and so does anything that
// resolves its own name. A hosts file the container's root brings is kept
// when it already names the host.
func writeHosts(st *State, upper string) error {
	lower := st.Config.RootFS
	if lower == "" {
		lower = "/"
	}
	dst := filepath.Join(upper, "etc", "hosts")
	if _, err := os.Lstat(dst); err == nil {
		return nil // the container's own, from a run before
	}
	if err := mkParents(upper, lower, "/etc"); err != nil {
		return fmt.Errorf("hosts file of %s: %w", st.Config.Name, err)
	}
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	if st.Addr.IsValid() && st.Config.Hostname != "" {
		fmt.Fprintf(&b, "%s\t%s\n", st.Addr, st.Config.Hostname)
	}
	return os.WriteFile(dst, []byte(b.String()), 0o644)
}

// ErrBadConfig is wrapped by Run's refusals of a configuration that cannot
// work: volumes, limits.
var ErrBadConfig = errors.New("bad container configuration")

// hidden are the host paths no container sees.
func (m *Manager) hidden() ([]string, error) { return hiddenPaths("/", m.hiddenDirs()) }

// hiddenDirs are cairn's dirs no container sees: this instance's, the
// default data dir, what the operator hides, and every other instance's
// on the host (instances.go).
func (m *Manager) hiddenDirs() []string {
	dirs := append([]string{m.opts.DataDir, m.opts.StagingDir, DefaultDataDir}, m.opts.Hide...)
	return append(dirs, otherInstances(m.instance)...)
}

// checkVolumes refuses, of volumes checkGrants passed, host paths that
// are not directories on this node, and those that would show a
// container what cairn hides from it (its data, staging and credentials,
// the host's secrets) or the kernel's own file systems, as they are
// written or through the symlinks they hold. It returns the volumes with
// their host paths resolved: what is mounted is what was checked. hidden
// is m.hidden().
func checkVolumes(vs []Volume, hidden []string) ([]Volume, error) {
	out := make([]Volume, 0, len(vs))
	for _, v := range vs {
		real, err := filepath.EvalSymlinks(v.Host)
		if err != nil {
			return nil, fmt.Errorf("%w: volume %s: not a directory on this node", ErrBadConfig, v.Host)
		}
		if real == "/" || under(real, hostOnly...) {
			return nil, fmt.Errorf("%w: volume %s is %s, which may not be a volume", ErrBadConfig, v.Host, real)
		}
		for _, h := range hidden {
			for _, p := range []string{v.Host, real} {
				if p == h || strings.HasPrefix(p, h+"/") || strings.HasPrefix(h, p+"/") {
					return nil, fmt.Errorf("%w: volume %s would show the container %s, which cairn hides from it", ErrBadConfig, v.Host, h)
				}
			}
		}
		if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%w: volume %s: not a directory on this node", ErrBadConfig, v.Host)
		}
		var fs unix.Statfs_t
		if err := unix.Statfs(real, &fs); err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Host, err)
		}
		if name, ok := kernelFS[int64(fs.Type)]; ok {
			return nil, fmt.Errorf("%w: volume %s is on %s, the kernel's view of the host, which may not be a volume", ErrBadConfig, v.Host, name)
		}
		v.Host = real
		out = append(out, v)
	}
	return out, nil
}

// kernelFS are the file systems through which a container could read or
// change the host's kernel state, by magic number (statfs(2)).
var kernelFS = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "procfs",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.CGROUP_SUPER_MAGIC:  "cgroupfs",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	unix.BPF_FS_MAGIC:        "bpffs",
	unix.TRACEFS_MAGIC:       "tracefs",
}
