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
// crash left in tmp/, and reads the headers of packs that no index file
// lists: valid ones are indexed again, ones without a valid trailer are
// removed.
//
// # Locking
//
// A writer holds an exclusive flock(2) on the file "lock" in the store
// directory from Open to Close, so there is at most one writer per store;
// a second writer gets ErrLocked. Readers (Options.ReadOnly) take no lock:
// every file they can see under its final name is complete and immutable,
// so they can read while a writer adds to the store. A reader sees the
// chunks and manifests that were durable when it opened the store, plus
// manifests written later. flock does not work over some network file
// systems; the store is meant for a local disk.
//
// The byte layouts are specified in docs/format.md.
package store
