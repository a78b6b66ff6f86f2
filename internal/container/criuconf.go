package container

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/cairn-hpc/cairn/internal/criu"
)

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
//     (docs/node.md, "Known limits").
//   - network-lock nftables, where CRIU can: the iptables method runs
//     iptables-restore, and with Debian 12's nft-backed iptables the unlock
//     alone stalls the container for about 70 ms per checkpoint.
//   - manage-cgroups=ignore (the "=" matters: the argument is optional,
//     and a separate word would be taken for no argument): CRIU leaves
//     cgroups alone. runc makes the container's cgroups and sets their
//     limits before a restore, and puts CRIU in them, so the restored
//     processes are in them from their fork; a rank cannot make cgroups
//     of its own (its cgroupfs is read-only). What CRIU would do besides
//     costs the stall: reading every controller's settings at a dump
//     (about 10 ms of a 16 MiB container's 120 ms dump here), and mounting
//     a yard of every cgroup v1 controller at a restore, which other
//     CRIUs and runcs on the host then meet (transientDump, yardVanished).
//     The restored processes run until Restore freezes them if asked to,
//     as they did before: CRIU skipped the settings of cgroups that
//     existed, and runc makes them all.
//
// CRIU is asked once per Manager whether it can lock with nftables, and
// only when probe is set: by a checkpoint before its dump and by a restore
// by CRIU, never by a fresh start, which runs no CRIU (an application-level
// job's ranks never do). A config written without asking uses what is
// known, and the next checkpoint writes it again.
func (m *Manager) criuConfig(ctx context.Context, probe bool) []byte {
	if probe {
		m.nftOnce.Do(func() {
			path, err := criu.Find(m.opts.CRIU)
			if err != nil {
				return
			}
			m.nftLock.Store(exec.CommandContext(ctx, path, "check", "--feature", "network_lock_nftables").Run() == nil)
		})
	}
	conf := fmt.Sprintf("file-locks\nmanage-cgroups=ignore\nghost-limit %d\n", shmSize)
	for _, d := range irmapScan {
		conf += "irmap-scan-path " + d + "\n"
	}
	if m.nftLock.Load() {
		return []byte(conf + "network-lock nftables\n")
	}
	return []byte(conf + "# network-lock: CRIU's default (iptables)\n")
}

// writeCRIUConfig writes container name's CRIU config file (criuConfig)
// and returns its path. A file that says it already is left as it is: a
// checkpoint writes it before every dump, and on a node whose disk is busy
// storing other images even a small write can wait for the journal.
func (m *Manager) writeCRIUConfig(ctx context.Context, name string, probe bool) (string, error) {
	p := filepath.Join(m.dir(name), "criu.conf")
	conf := m.criuConfig(ctx, probe)
	if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, conf) {
		return p, nil
	}
	return p, os.WriteFile(p, conf, 0o600)
}
