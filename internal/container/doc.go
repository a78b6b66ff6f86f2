// Package container runs containers on one node with runc, and
// checkpoints and restores them with CRIU: the single containers of the
// command line, and a cluster's rank containers, which a node's agent
// runs through the same [Manager].
//
// Nouns:
//   - container: one runc container made and owned by cairn, named by the
//     user (a rank's is JOB.RANK). Its root is an overlay: the lower layer
//     is the host's / (or a rootfs directory the user gives), with the
//     host's secrets and cairn's own dirs masked (mask.go); the upper dir
//     holds everything the container wrote. It runs in its own pid,
//     mount, uts, ipc and network namespaces and a cgroup; the network
//     namespace is made by cairn (package netw; or by the agent, for a
//     rank, Config.Net) and joined by runc by path, so that a restore can
//     re-create it empty with the same addresses.
//   - status: what a container is doing ([Status]), derived when asked
//     from runc's state, the shim's exit record and the state file, never
//     stored. [Status.Live] and [Status.Active] say which statuses count as
//     a container still there.
//   - shim: a small process (`cairn shim`, started detached by [Manager])
//     that owns the container's stdio pipes, copies its output into the
//     container's log, reaps its init process and records its exit. The
//     shim lets the container outlive the cairn command that started it;
//     all other state is in files under the data dir, so any cairn process
//     can pick up where another left off.
//   - checkpoint: freeze the container's cgroup (a freeze note says who
//     froze it) → capture the fs delta → CRIU dump via `runc checkpoint
//     --leave-running` into staging (tmpfs) → flush the output still in
//     the shim's pipe → thaw → store the staged image (package image).
//     The container is stalled only while its state is copied to memory.
//     [Manager.Prepare] stops after the dump, leaving the container frozen
//     ([Prepared]): the first phase of a global checkpoint, which commits
//     or aborts it. A files-only checkpoint ([PrepareOptions].FilesOnly,
//     an application-level job's) captures the fs delta and the output
//     only, and runs no CRIU. A container whose lazy restore is still
//     bringing its memory is waited for before it is frozen, and the
//     kernel asked after ([Manager.AwaitMemory], memory.go): no memory
//     that has not arrived is ever dumped.
//   - restore: take the image kept in staging since its checkpoint if it
//     is the one asked for (kept.go), else verify the image while copying
//     it into staging (for a lazy restore, all of it but the memory pages
//     CRIU does not read at once, which arrive while the processes run:
//     lazy.go) → new overlay from the fs delta → new netns with the same
//     address → `runc restore`. A files-only image's container is
//     restarted instead: its command starts afresh on the restored files
//     (`runc run`, or `runc create` and, at [Manager.Resume], `runc start`),
//     told the checkpoint's number in $CAIRN_RESTART.
//   - API dir: a rank's own host directory for the rank API's socket,
//     bound at /run/cairn ([Config].RankAPI, [Manager.APIDir], apidir.go).
//   - grants: what a config gives a container on the host (volumes, a
//     root, the rank API, limits), checked by one set of rules for run and
//     for a record read from a file or a peer, which grants nothing by
//     itself (grants.go, [CheckRecordedConfig]); volumes resolved and their
//     file systems asked (mask.go); no setuid or setgid file made
//     (seccomp.go); every cairn instance's dirs hidden from every
//     container (instances.go); a staging dir root's alone
//     ([Manager.StagingRoot], staging.go).
//   - incarnation: one run of a container's processes, from `run` or from a
//     restore. Its log starts with the output kept with its checkpoint (up
//     to the instant the checkpoint froze the container, what was still in
//     the shim's pipe included), so it reads as one uninterrupted run's;
//     earlier incarnations' logs are kept beside it (incarnation.go,
//     output.go).
//   - watchdog: whoever freezes a container first writes a freeze note; a
//     note whose writer died is released (cgroup thawed, network locks
//     lifted) by the container's shim, and by any command that reads the
//     container (watchdog.go).
//
// Logs name a container under the key rank (its name) and an image under
// ckpt (NAME:SEQ).
//
// Data dir layout (see docs/node.md, "A container"):
//
//	<data>/instance                 random id of this data dir (cgroup, netns, veth names)
//	<data>/containers/<name>/       state.json, config.json (runc bundle), criu.conf,
//	                                rootfs/, upper/, work/, container.log (and .times,
//	                                logtimes.go), exit.json,
//	                                shim.sock, incarnations.json, incarnations/N.log,
//	                                frozen-by (freeze note), api/ (the rank API's dir),
//	                                runc and CRIU logs
//	<data>/checkpoints/<name>/<seq>.json  catalog records (package image)
//	<data>/store/                   the content-addressed store (package store)
//	<data>/runc/                    runc's own state (runc --root)
//	<data>/net/ipam.json            address allocation (package netw)
//	<data>/locks/<name>.lock        every change to a container happens under its flock
//	<staging>/                      staged images being dumped or restored
//	                                (NAME-SEQ-pidPID-*, restore-*), kept images (kept/)
package container
