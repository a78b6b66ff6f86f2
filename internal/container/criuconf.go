package container

import (
	"context"
	"fmt"
	"os/exec"

	"cairn/internal/criu"
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
