// Package pack reads and writes pack files, the containers in which the
// store keeps chunks on disk.
//
// # Nouns
//
// A pack is one file holding many blobs. A blob is one chunk as stored: its
// bytes after optional zstd compression. Each blob is described by an entry:
// the chunk id, the blob's offset and stored length in the pack, the chunk's
// raw (uncompressed) length, and the compression used. The header is the
// array of entries of a pack; the trailer is the fixed-size record that ends
// the pack and locates and checksums the header.
//
// Blobs come first and the header last, as in restic: a pack is written in a
// single pass without knowing its entries in advance, and the entries of
// every pack can be listed (and an index rebuilt) by reading the tail of each
// pack file only. A pack without a valid trailer was not finished.
//
// The package knows nothing about hashing or compressing chunks; it stores
// and checks the bytes and entries it is given. The byte layout is specified
// in docs/format.md.
package pack
