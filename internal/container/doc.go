// Package container runs rank containers on one node with runc, and
// checkpoints and restores them with CRIU.
//
// Nouns:
//   - container: one runc container made and owned by cairn, named by the
//     user. Its root is an overlay: the lower layer is the host's / (or a
//     rootfs directory the user gives), the upper dir holds everything the
//     container wrote. It runs in its own pid, mount, uts, ipc and network
//     namespaces and a cgroup; the network namespace is made by cairn
//     (package netw) and joined by runc by path, so that a restore can
//     re-create it empty with the same addresses.
//   - shim: a small process (`cairn shim`, started detached by [Manager])
//     that owns the container's stdio pipes, copies its output into the
//     container's log, reaps its init process and records its exit. The
//     shim lets the container outlive the cairn command that started it;
//     all other state is in files under the data dir, so nothing important
//     lives only in a process's memory.
//   - checkpoint: pause (freezer) → capture the fs delta → CRIU dump via
//     `runc checkpoint` into staging (tmpfs) → resume → persist staging as
//     an image (package image). The container is stalled only while its
//     state is copied to memory.
//   - restore: verify an image while copying it into staging → new overlay
//     from the fs delta → new netns with the same address → `runc restore`.
//   - incarnation: one run of a container's processes, from `run` or from a
//     restore. Its log starts with the output kept with its checkpoint (up
//     to the instant the checkpoint froze the container, what was still in
//     the shim's pipe included), so it reads as one uninterrupted run's;
//     earlier incarnations' logs are kept beside it (incarnation.go,
//     output.go).
//
// Data dir layout (see docs/architecture.md):
//
//	<data>/instance                 random id of this data dir (cgroup, netns names)
//	<data>/containers/<name>/       state.json, config.json (runc bundle), rootfs/,
//	                                upper/, work/, container.log, exit.json, runc.log,
//	                                shim.sock, incarnations.json, incarnations/N.log
//	<data>/checkpoints/<name>/<seq>/  images (package image)
//	<data>/runc/                    runc's own state (runc --root)
//	<data>/net/ipam.json            address allocation (package netw)
package container
