// Package image keeps checkpoint images: everything needed to bring one
// container back as it was at a checkpoint, stored in the node's
// content-addressed store (package store) and listed in a catalog of
// records beside it.
//
// Nouns:
//   - image: one container's state at one checkpoint: CRIU's image files
//     (process tree, memory pages, sockets, ...), the fs delta and the
//     container's output up to the checkpoint (LogName, and when its
//     bytes came, LogTimesName). A files-only
//     image (an application-level checkpoint, [Record].FilesOnly) has no
//     CRIU files: its container starts afresh on the restored files.
//   - staged image: an image as a checkpoint leaves it in staging (tmpfs)
//     before it is stored, or as a restore reads it: CRIU's files under
//     CRIUDir, the fs delta as the tar DeltaName, the output as LogName
//     and LogTimesName.
//   - fs delta: the container's overlay upper dir (everything it wrote,
//     whiteouts for what it deleted included), captured as a tar stream
//     with owners, modes, times and xattrs ([PackDelta]); in the store a
//     tree of manifest nodes under FSDir, so that files dedup chunk by
//     chunk as memory does. [UnpackDelta] makes the tree from the tar (a
//     migrated rank's files), Materialize from the store; both refuse
//     `..`, absolute paths, device nodes and paths through the tree's own
//     symlinks.
//   - record: the catalog entry of one image ([Record], Dir/NAME/SEQ.json):
//     what was captured, when, with which CRIU and kernel, the container's
//     config, and the ID of the store manifest that lists the image's
//     files as chunks. It is written last, once the manifest is durable: a
//     listed checkpoint is always complete.
//   - repo: a node's images ([Repo]): the catalog of records over the
//     store. [Repo.Ingest] cuts a staged image into chunks (CRIU's pages
//     files into 4 KiB pages, everything else by content, [ParamsFor]) and
//     stores only those the store lacks; [Repo.Materialize] writes an image
//     back out for a restore, every chunk verified against its ID as it is
//     read; [Repo.Verify] checks one without writing it; [Repo.GC],
//     [Repo.DiskUsage] and [Repo.Strays] keep the catalog and the store
//     tidy.
//   - shape: what an image's manifest may hold for a restore to make it
//     (CRIU's plain files under CRIUDir, none in a files-only image; the
//     fs delta under FSDir; the output; nothing else). Import, Receive, Materialize and Verify check
//     a manifest's shape, Ingest and UnpackDelta each entry, all with one
//     check per node.
//   - streams between nodes, all hostile input whose names package names
//     checks: export files ([Repo.Export], [Repo.Import]: one checkpoint,
//     self-contained); delta export streams ([Repo.ExportDelta],
//     [Repo.Receive]: a checkpoint to a peer, without the chunks it has);
//     chunk streams ([ChunkSource], [ChunkWriter]: a share of an image's
//     chunks, from each of several holders); staged-image streams
//     ([WriteStaged], [ReceiveStaged]: a staged image, for a migration).
//   - head: what a node learns of an image before its chunks ([Head]: its
//     record and manifest), all a lazy restore needs to start
//     ([MaterializeLazy]).
//
// A damaged chunk, manifest or record is reported as a [*CorruptError]
// (matching [ErrCorrupt]) that names every checkpoint sharing the damage.
//
// This package is the only one that knows how an image maps onto the
// store; the store is the only one that knows the bytes on disk
// (docs/format.md §11).
package image
