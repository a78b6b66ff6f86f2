// Package image writes and reads checkpoint images: everything needed to
// bring one container back as it was at a checkpoint.
//
// Nouns:
//   - image: one container's state at one checkpoint: the CRIU image files
//     (process tree, memory pages, sockets, ...), the fs delta and the
//     container's output up to the checkpoint (LogName).
//   - fs delta: the container's overlay upper dir (everything it wrote,
//     including whiteouts for what it deleted), captured as a tar stream
//     with ownership, modes, times and xattrs; see [PackDelta] and
//     [UnpackDelta], which refuse `..`, absolute paths and device nodes.
//   - shape: what an image's manifest may hold for restore to make it
//     (CRIU's plain files under criu/, the fs delta under fs/, nothing
//     else). Import, Receive, Materialize and Verify check a manifest's
//     shape, ingest and UnpackDelta each entry, all with one per-node
//     check; export files, peers' streams and staged-image streams
//     (ReceiveStaged) are hostile input, their names checked by package
//     names.
//   - manifest: manifest.json in an image directory: what was captured, when,
//     with which CRIU, the container's config, and the size and BLAKE3-256
//     hash of every file, so corruption and truncation are found before
//     CRIU ever reads the image.
//   - repo: the directory of images, one subdirectory per container and one
//     numbered image directory per checkpoint (seq 1, 2, ...). An image is
//     written to a temporary name and renamed when complete, so a partial
//     image is never listed.
//
// This package is the only one that knows the image layout on disk; the
// deduplicated chunk store will replace the plain directory format behind
// the same functions.
package image
