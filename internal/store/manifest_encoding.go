package store

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// ManifestMagic starts every encoded manifest: "CAIRNMF" and the format
// version 1.
const ManifestMagic = "CAIRNMF\x01"

// Minimum encoded sizes, which bound the counts a decoder accepts.
const (
	minNodeSize  = 4 + 1 + 1 + 3*4 + 8 + 4 + 8 + 4 + 4 + 2*4 + 4
	minPairSize  = 4 + 1 + 4 // a label or xattr: non-empty name, empty value
	checksumSize = IDSize
)

// MarshalBinary encodes m canonically (docs/format.md): labels ordered by
// key, nodes by path, xattrs by name, integers little-endian, and a BLAKE3
// checksum at the end. It returns an error wrapping ErrInvalidManifest if a
// node is invalid or two nodes share a path.
func (m *Manifest) MarshalBinary() ([]byte, error) {
	nodes, err := m.sortedNodes()
	if err != nil {
		return nil, err
	}
	for k, v := range m.Labels {
		if k == "" || len(k) > MaxLabelLen || len(v) > MaxLabelLen {
			return nil, fmt.Errorf("%w: label %.20q of %d bytes with value of %d bytes", ErrInvalidManifest, k, len(k), len(v))
		}
	}
	b := []byte(ManifestMagic)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Labels)))
	for _, k := range slices.Sorted(maps.Keys(m.Labels)) {
		b = appendString(b, k)
		b = appendString(b, m.Labels[k])
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(nodes)))
	for _, n := range nodes {
		b = appendString(b, n.Path)
		b = append(b, byte(n.Kind))
		b = binary.LittleEndian.AppendUint32(b, n.Mode)
		b = binary.LittleEndian.AppendUint32(b, n.UID)
		b = binary.LittleEndian.AppendUint32(b, n.GID)
		b = binary.LittleEndian.AppendUint64(b, uint64(n.MTime.Unix()))
		b = binary.LittleEndian.AppendUint32(b, uint32(n.MTime.Nanosecond()))
		b = binary.LittleEndian.AppendUint64(b, n.Size)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(n.Chunks)))
		for _, id := range n.Chunks {
			b = append(b, id[:]...)
		}
		b = appendString(b, n.Target)
		b = binary.LittleEndian.AppendUint32(b, n.Major)
		b = binary.LittleEndian.AppendUint32(b, n.Minor)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(n.Xattrs)))
		for _, x := range n.Xattrs {
			b = appendString(b, x.Name)
			b = appendString(b, string(x.Value))
		}
	}
	sum := Hash(b)
	return append(b, sum[:]...), nil
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// UnmarshalBinary decodes a manifest encoded by MarshalBinary. It accepts
// only canonical encodings with a valid checksum, so that a manifest's bytes
// and its ID correspond one to one, and returns an error wrapping
// ErrInvalidManifest for anything else. It never panics.
func (m *Manifest) UnmarshalBinary(data []byte) error {
	if len(data) < len(ManifestMagic)+8+checksumSize {
		return fmt.Errorf("%w: %d bytes is too short", ErrInvalidManifest, len(data))
	}
	if string(data[:len(ManifestMagic)]) != ManifestMagic {
		return fmt.Errorf("%w: magic %q", ErrInvalidManifest, data[:len(ManifestMagic)])
	}
	body, sum := data[:len(data)-checksumSize], data[len(data)-checksumSize:]
	if got := Hash(body); string(got[:]) != string(sum) {
		return fmt.Errorf("%w: checksum mismatch", ErrInvalidManifest)
	}
	d := decoder{b: body[len(ManifestMagic):]}
	var out Manifest
	nlabels := d.count(minPairSize)
	if nlabels > 0 {
		out.Labels = make(map[string]string, nlabels)
	}
	prev := ""
	for i := range nlabels {
		k, v := d.str(MaxLabelLen), d.str(MaxLabelLen)
		if d.err == nil && (k == "" || (i > 0 && k <= prev)) {
			d.fail(fmt.Errorf("label %q empty or out of order", k))
		}
		out.Labels[k] = v
		prev = k
	}
	nnodes := d.count(minNodeSize)
	if nnodes > 0 {
		out.Nodes = make([]Node, 0, nnodes)
	}
	for i := range nnodes {
		n := d.node()
		if d.err != nil {
			break
		}
		if i > 0 && n.Path <= out.Nodes[i-1].Path {
			d.fail(fmt.Errorf("node %q out of order", n.Path))
			break
		}
		if err := n.validate(); err != nil {
			d.fail(fmt.Errorf("node %q: %w", n.Path, err))
			break
		}
		out.Nodes = append(out.Nodes, n)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Errorf("%d trailing bytes", len(d.b)))
	}
	if d.err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidManifest, d.err)
	}
	*m = out
	return nil
}

// decoder reads little-endian fields; after the first error it returns zero
// values and keeps that error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail(fmt.Errorf("truncated: need %d bytes, have %d", n, len(d.b)))
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// count reads a count of items of at least minSize bytes each, failing if
// they cannot fit in the remaining bytes.
func (d *decoder) count(minSize int) int {
	n := uint64(d.u32())
	if n*uint64(minSize) > uint64(len(d.b)) {
		d.fail(fmt.Errorf("%d items do not fit in %d bytes", n, len(d.b)))
		return 0
	}
	return int(n)
}

func (d *decoder) str(max int) string {
	n := uint64(d.u32())
	if n > uint64(max) {
		d.fail(fmt.Errorf("string of %d bytes above %d", n, max))
		return ""
	}
	return string(d.take(n))
}

func (d *decoder) node() Node {
	var n Node
	n.Path = d.str(MaxPathLen)
	n.Kind = Kind(d.u8())
	n.Mode, n.UID, n.GID = d.u32(), d.u32(), d.u32()
	sec, nsec := int64(d.u64()), d.u32()
	if nsec >= 1e9 {
		d.fail(fmt.Errorf("mtime nanoseconds %d", nsec))
	}
	n.MTime = time.Unix(sec, int64(nsec)).UTC()
	if n.MTime.Unix() != sec {
		d.fail(fmt.Errorf("mtime %d out of range", sec))
	}
	n.Size = d.u64()
	if c := d.count(IDSize); c > 0 {
		n.Chunks = make([]ID, c)
		for i := range n.Chunks {
			copy(n.Chunks[i][:], d.take(IDSize))
		}
	}
	n.Target = d.str(MaxPathLen)
	n.Major, n.Minor = d.u32(), d.u32()
	if c := d.count(minPairSize); c > 0 {
		n.Xattrs = make([]Xattr, 0, c)
		for i := range c {
			x := Xattr{Name: d.str(MaxXattrNameLen), Value: []byte(d.str(MaxXattrValueLen))}
			if d.err == nil && i > 0 && strings.Compare(x.Name, n.Xattrs[i-1].Name) <= 0 {
				d.fail(fmt.Errorf("xattr %q out of order", x.Name))
			}
			n.Xattrs = append(n.Xattrs, x)
		}
	}
	return n
}
