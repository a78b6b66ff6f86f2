package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Export file format constants; see docs/format.md, "Export file".
const (
	// ExportMagic starts every self-contained export file: "CAIRNEX" and
	// the format version 1.
	ExportMagic = "CAIRNEX\x01"
	// DeltaExportMagic starts every delta export stream, one that leaves
	// out chunks the receiver already has: "CAIRNDX" and the format
	// version 1. A magic of its own, rather than a flag, makes an importer
	// that expects a self-contained file (or predates delta streams)
	// refuse it at the first bytes.
	DeltaExportMagic = "CAIRNDX\x01"
	// MaxExportMetaSize is the largest meta an export file may carry.
	MaxExportMetaSize = 16 << 20
	// MaxManifestSize is the largest encoded manifest an export file may
	// carry.
	MaxManifestSize = 1 << 30

	exportChunkHeaderSize = IDSize + 4 + 4 + 1 + 3
)

// ErrDeltaExport is returned, wrapped, by Import without
// ImportOptions.AllowDelta when given a delta export stream: the stream
// is not damaged, but it is only complete together with chunks the
// importing store was expected to have.
var ErrDeltaExport = errors.New("delta export stream: it leaves out chunks the receiver is expected to have")

// ExportOptions configure Export.
type ExportOptions struct {
	// Progress, if set, is called on Export's goroutine after each chunk
	// written, with the number of chunks done and the total.
	Progress func(done, total int64)
	// Skip, if set, makes Export write a delta export stream
	// (DeltaExportMagic) that leaves out every chunk for which Skip
	// returns true: how a checkpoint is copied to a peer that has most
	// of its chunks already. Skip is called for every reference to a
	// chunk (a chunk referenced twice is asked about twice, and must get
	// the same answer), on Export's goroutine, before anything is written
	// to w. The receiver must have the skipped chunks (Import with
	// AllowDelta checks).
	Skip func(ID) bool
}

// Export writes the manifests, meta and every chunk the manifests reference
// to w as one self-contained export file (docs/format.md, "Export file"),
// or, with opts.Skip, as a delta export stream without the skipped chunks.
// Manifests are written in the order given, duplicates dropped; chunks once
// each, in order of first reference, as stored (compressed) and verified
// against their IDs on the way. meta is opaque to the store (cairn puts the
// checkpoint's description there) and at most MaxExportMetaSize bytes.
// Export holds a read session while it runs. On error, what was written to
// w is not a valid export file.
func (s *Store) Export(ctx context.Context, w io.Writer, manifests []ID, meta []byte, opts ExportOptions) error {
	return s.exporting(ctx, func() error {
		seen := make(map[ID]bool)
		var ms []*Manifest
		for _, id := range manifests {
			if seen[id] {
				continue
			}
			seen[id] = true
			m, err := s.LoadManifest(ctx, id)
			if err != nil {
				return fmt.Errorf("export: %w", err)
			}
			ms = append(ms, m)
		}
		return s.export(ctx, w, ms, meta, opts)
	})
}

// ExportManifests is Export for manifests loaded already (LoadManifest),
// written in the order given: how a node that keeps an image's manifest
// in memory serves its head (the record and manifest of a delta stream
// that leaves out every chunk) without loading and verifying the manifest
// again.
func (s *Store) ExportManifests(ctx context.Context, w io.Writer, ms []*Manifest, meta []byte, opts ExportOptions) error {
	return s.exporting(ctx, func() error { return s.export(ctx, w, ms, meta, opts) })
}

// exporting runs export under a read session.
func (s *Store) exporting(ctx context.Context, export func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	release, err := s.ReadSession(ctx)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer release()
	return export()
}

// export writes ms, meta and the chunks they reference (exporting holds
// the read session).
func (s *Store) export(ctx context.Context, w io.Writer, ms []*Manifest, meta []byte, opts ExportOptions) error {
	if len(meta) > MaxExportMetaSize {
		return fmt.Errorf("export: meta of %d bytes is above the %d byte limit", len(meta), MaxExportMetaSize)
	}
	encoded := make([][]byte, 0, len(ms))
	var chunks []ID
	seenChunk := make(map[ID]bool)
	for _, m := range ms {
		b, err := m.MarshalBinary()
		if err != nil {
			return fmt.Errorf("export manifest: %w", err)
		}
		encoded = append(encoded, b)
		for _, n := range m.Nodes {
			for _, c := range n.Chunks {
				// Skipped chunks are left out before they are
				// counted: the head of an image (every chunk
				// skipped) costs no set of its chunks.
				if opts.Skip != nil && opts.Skip(c) {
					continue
				}
				if !seenChunk[c] {
					seenChunk[c] = true
					chunks = append(chunks, c)
				}
			}
		}
	}
	magic := ExportMagic
	if opts.Skip != nil {
		magic = DeltaExportMagic
	}

	out := newSummedWriter(w)
	var b []byte
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(meta)))
	b = append(b, meta...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(encoded)))
	for _, m := range encoded {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m)))
		b = append(b, m...)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(chunks)))
	if _, err := out.Write(b); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	for i, c := range chunks {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		loc, blob, _, err := s.fetch(ctx, c)
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		if err := out.record(c, loc.Length, loc.RawLength, loc.Compression, blob); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		if opts.Progress != nil {
			opts.Progress(int64(i+1), int64(len(chunks)))
		}
	}
	if err := out.finish(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}
