// Package index maps chunk ids to where their blobs live.
//
// # Nouns
//
// A location is a pack id plus the pack entry of a blob: offset, stored
// length, raw length and compression. The Index is the in-memory map from
// chunk id to location, and the set of packs it covers. An index file is the
// on-disk form of part of an Index: the entries of one or more packs, grouped
// by pack, with a checksum. The store writes one new index file per flush and
// loads all of them at open; since a pack's own header holds the same
// entries, every index file can be rebuilt from the packs alone.
//
// The index file layout is specified in docs/format.md. Entries use the same
// 56-byte layout as pack headers (pack.AppendEntry).
package index
