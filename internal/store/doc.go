// Package store is cairn's content-addressed, deduplicated checkpoint store.
//
// # Nouns
//
// Chunk: a run of bytes cut by package chunker from a CRIU image file or a
// file of the overlay delta. A chunk is named by its ID, the BLAKE3-256 hash
// of its bytes, and is stored once however often it is put: that is the
// deduplication.
//
// Blob: a chunk as stored, compressed with zstd unless compression would not
// shrink it.
//
// Pack: a file holding many blobs, followed by a header listing them and a
// trailer that checksums the header (package pack). A pack is named by the
// hash of its bytes and never changes once written.
//
// Index: the map from chunk ID to pack, offset and lengths (package index).
// It is kept on disk as index files, one per flush, and can be rebuilt from
// the pack headers alone.
//
// Manifest: the description of a tree of files (paths, kinds, modes, owners,
// xattrs, times, symlink targets, devices, overlay whiteouts) whose regular
// files are lists of chunk IDs. A manifest is stored as its own file, named
// by the hash of its bytes.
//
// # Durability
//
// Put only queues a chunk in the open pack. Flush finishes that pack, fsyncs
// it, renames it into place, and then writes and fsyncs an index file for
// every pack not yet indexed; only then are the chunks durable. PutManifest
// flushes and checks that every chunk the manifest references is durable
// before it writes the manifest, so a durable manifest never refers to a
// chunk that a crash could lose.
//
// Files are first written under tmp/ and renamed into place after an fsync,
// followed by an fsync of the directory. Open by a writer removes whatever a
// crash left in tmp/, and reads the packs that no index file lists: valid
// ones are indexed again; damaged ones (not hashing to their names, or
// without a valid header) are moved to quarantine/ with a report, after
// every blob of them that still verifies is stored again (Quarantined,
// QuarantineErr). Recovery removes nothing outside tmp/.
//
// # Lifecycle
//
// RemoveManifest deletes one manifest; GC deletes every manifest not in its
// keep list and reclaims the chunks no kept manifest references by
// repacking: the live chunks of packs that hold dead ones are copied,
// verified, into new packs; the new packs and one index file listing every
// remaining pack are made durable; then the old index files are deleted,
// and only then the old packs. A crash at any step leaves a store whose
// kept manifests are complete (unreclaimed space is reclaimed by the next
// GC). Check verifies packs, index and manifests and names, for every bad
// chunk, the manifests that use it. Export and Import move a set of
// manifests and their chunks between stores as one self-contained file,
// or, as a delta export stream (ExportOptions.Skip), without the chunks
// the receiving store already has. ExportChunks and ImportChunks move
// chunks without manifests, as a chunk stream: how a node fetching an
// image from several holders takes a share of its chunks from each.
// Scrub sets aside the stored copies of chunks that do not read back
// intact (listed in the file "damaged"), so that the next good copy put
// or imported is stored again.
//
// # Locking
//
// A writer holds an exclusive flock(2) on the file "lock" in the store
// directory from Open to Close, so there is at most one writer per store;
// a second writer gets ErrLocked. Readers (Options.ReadOnly) do not take
// that lock: every file they can see under its final name is complete and
// immutable, so they can read while a writer adds to the store. A reader
// sees the chunks and manifests that were durable when it opened the
// store, plus manifests written later. flock does not work over some
// network file systems; the store is meant for a local disk.
//
// GC is the only operation that deletes packs and index files, and it
// coordinates with readers through a second file, "readers":
//
//   - A read session (ReadSession, and internally Check, Export, a reader's
//     Open and a reader's index reload) holds a shared flock on "readers"
//     until it is released.
//   - GC takes an exclusive flock on "readers" after its new packs and index
//     file are durable and the writer's in-memory index points at them, and
//     holds it only while it deletes the old index files and packs. It
//     polls for the lock until its context is done; if the context ends
//     first, GC returns its error with nothing deleted and the store
//     consistent.
//
// So no pack or index file disappears during a read session, and a reader
// never loads a half-deleted set of index files. A reader whose index
// predates a GC (opened before it, without a session) finds a pack gone
// when it reads: Get then reloads the index files under the shared lock
// and retries once; the chunk is in its new pack, or ErrNotFound if GC
// reclaimed it because no kept manifest uses it.
//
// Within the writer's process, Get never blocks on GC: GC swaps the
// in-memory index before deleting a pack, and a Get that loses the race
// looks the chunk up again. Writes (Put, Flush, PutManifest, RemoveManifest,
// Import) wait while GC or RebuildIndex runs; GC waits for writes in
// progress. A read session open in the writer's own process also holds
// GC off: do not call GC on a goroutine that holds a session.
//
// The byte layouts are specified in docs/format.md.
package store
