// Package chunker splits a byte stream into chunks for the content-addressed
// store.
//
// # Nouns
//
// A chunk is a contiguous run of bytes of the input stream. The chunker only
// decides where chunks begin and end (their boundaries); it does not hash,
// compress or store them. Chunks are named by the store, which hashes them.
//
// A boundary (or cut point) is the offset at which one chunk ends and the next
// begins.
//
// Params fix the chunk size limits: Min, Avg and Max. With Min < Max the
// chunker is content-defined (CDC): a boundary is placed after a byte when a
// rolling gear hash over the preceding 64 bytes matches a mask, so boundaries
// depend only on local content and move with it when bytes are inserted or
// removed earlier in the stream. Normalized chunking (FastCDC, Xia et al.,
// USENIX ATC 2016) uses a harder mask before Avg and an easier one after it,
// which narrows the size distribution around Avg. With Min == Avg == Max
// (see Fixed) the chunker cuts every Max bytes: this is the page-aligned mode
// meant for CRIU page images, whose content is whole 4 KiB pages.
//
// The algorithm, the gear table and the chosen default sizes are part of the
// on-disk format (they decide which chunk ids exist) and are specified in
// docs/format.md. Golden tests pin them: a change that moves a boundary fails.
//
// The package does no I/O beyond reading the io.Reader it is given and takes
// no context: it is a pure function of the input bytes and Params.
package chunker
