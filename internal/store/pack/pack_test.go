package pack_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/store/pack"
)

type blob struct {
	data []byte
	raw  int
	c    pack.Compression
}

func testBlobs() []blob {
	return []blob{
		{[]byte("hello, world"), 12, pack.None},
		{bytes.Repeat([]byte{0xab}, 1000), 1000, pack.None},
		{[]byte("pretend zstd frame"), 4096, pack.Zstd},
		{nil, 0, pack.None},
		{[]byte{1}, 1, pack.None},
	}
}

// writePack writes blobs into a pack and returns its bytes and entries.
func writePack(t testing.TB, blobs []blob) ([]byte, []pack.Entry) {
	t.Helper()
	var buf bytes.Buffer
	w := pack.NewWriter(&buf)
	for _, b := range blobs {
		id := blake3.Sum256(b.data)
		if _, err := w.Add(id, b.data, b.raw, b.c); err != nil {
			t.Fatalf("Add: %v", err)
		}
	}
	entries, err := w.Finish()
	if err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if w.Size() != uint64(buf.Len()) {
		t.Fatalf("Size() = %d, wrote %d bytes", w.Size(), buf.Len())
	}
	return buf.Bytes(), entries
}

func TestRoundTrip(t *testing.T) {
	blobs := testBlobs()
	p, written := writePack(t, blobs)
	wantSize := pack.HeaderOffset + pack.TrailerSize + len(blobs)*pack.EntrySize
	for _, b := range blobs {
		wantSize += len(b.data)
	}
	if len(p) != wantSize {
		t.Errorf("pack has %d bytes, want %d", len(p), wantSize)
	}
	got, err := pack.ReadHeader(bytes.NewReader(p), int64(len(p)))
	if err != nil {
		t.Fatalf("ReadHeader: %v", err)
	}
	if diff := cmp.Diff(written, got); diff != "" {
		t.Errorf("entries (-written +read):\n%s", diff)
	}
	for i, e := range got {
		if e.ID != blake3.Sum256(blobs[i].data) || int(e.RawLength) != blobs[i].raw || e.Compression != blobs[i].c {
			t.Errorf("entry %d = %+v does not describe blob %d", i, e, i)
		}
		data, err := pack.Load(bytes.NewReader(p), e, nil)
		if err != nil {
			t.Fatalf("Load %d: %v", i, err)
		}
		if !bytes.Equal(data, blobs[i].data) {
			t.Errorf("Load %d = %q, want %q", i, data, blobs[i].data)
		}
	}
}

func TestEmptyPack(t *testing.T) {
	p, _ := writePack(t, nil)
	if len(p) != pack.HeaderOffset+pack.TrailerSize {
		t.Fatalf("empty pack has %d bytes", len(p))
	}
	got, err := pack.ReadHeader(bytes.NewReader(p), int64(len(p)))
	if err != nil || len(got) != 0 {
		t.Fatalf("ReadHeader = %v, %v; want no entries", got, err)
	}
}

// TestTruncatedPack checks that every prefix of a pack, as left by a crash
// during writing, is rejected.
func TestTruncatedPack(t *testing.T) {
	p, _ := writePack(t, testBlobs())
	for n := range len(p) {
		if _, err := pack.ReadHeader(bytes.NewReader(p[:n]), int64(n)); !errors.Is(err, pack.ErrFormat) {
			t.Fatalf("ReadHeader of %d of %d bytes = %v, want ErrFormat", n, len(p), err)
		}
	}
}

// TestCorruptTail checks that changing any bit of the header or trailer is
// detected.
func TestCorruptTail(t *testing.T) {
	p, entries := writePack(t, testBlobs())
	hdrStart := int(entries[len(entries)-1].End())
	for i := range len(p) {
		if i >= pack.HeaderOffset && i < hdrStart {
			continue // blob bytes are checked by their hash when loaded
		}
		for bit := range 8 {
			q := bytes.Clone(p)
			q[i] ^= 1 << bit
			if _, err := pack.ReadHeader(bytes.NewReader(q), int64(len(q))); !errors.Is(err, pack.ErrFormat) {
				t.Fatalf("flipped bit %d of byte %d: ReadHeader = %v, want ErrFormat", bit, i, err)
			}
		}
	}
}

func TestShortReader(t *testing.T) {
	p, _ := writePack(t, testBlobs())
	// The size claims more bytes than the reader has.
	_, err := pack.ReadHeader(bytes.NewReader(p), int64(len(p))+10)
	if err == nil {
		t.Fatal("ReadHeader with a wrong size succeeded")
	}
	if _, err := pack.Load(bytes.NewReader(p[:20]), pack.Entry{Offset: 8, Length: 100, RawLength: 100}, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Load past the end = %v, want io.ErrUnexpectedEOF", err)
	}
}

// TestEntryLayout pins the byte layout of an entry (docs/format.md).
func TestEntryLayout(t *testing.T) {
	var id [32]byte
	for i := range id {
		id[i] = byte(i)
	}
	e := pack.Entry{ID: id, Offset: 0x0102030405060708, Length: 0x11223344, RawLength: 0x01020304, Compression: pack.Zstd}
	got := hex.EncodeToString(pack.AppendEntry(nil, e))
	want := "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f" +
		"0807060504030201" + "44332211" + "04030201" + "01" + "00000000000000"
	if got != want {
		t.Errorf("AppendEntry =\n%s\nwant\n%s", got, want)
	}
	// ParseEntry rejects it only because the raw length is too large.
	if _, err := pack.ParseEntry(pack.AppendEntry(nil, e)); !errors.Is(err, pack.ErrFormat) {
		t.Errorf("ParseEntry = %v, want ErrFormat for a too large blob", err)
	}
	e.Length, e.RawLength = 10, 20
	back, err := pack.ParseEntry(pack.AppendEntry(nil, e))
	if err != nil {
		t.Fatal(err)
	}
	if back != e {
		t.Errorf("ParseEntry = %+v, want %+v", back, e)
	}
}

func TestParseEntryRejects(t *testing.T) {
	good := pack.Entry{Offset: 8, Length: 5, RawLength: 5}
	tests := []struct {
		name   string
		mutate func(b []byte)
	}{
		{"unknown compression", func(b []byte) { b[48] = 2 }},
		{"reserved byte", func(b []byte) { b[55] = 1 }},
		{"uncompressed length mismatch", func(b []byte) { b[44] = 6 }},
		{"offset in magic", func(b []byte) { b[32] = 7 }},
		{"too long", func(b []byte) { b[43] = 0x10 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := pack.AppendEntry(nil, good)
			tc.mutate(b)
			if _, err := pack.ParseEntry(b); !errors.Is(err, pack.ErrFormat) {
				t.Errorf("ParseEntry = %v, want ErrFormat", err)
			}
		})
	}
	if _, err := pack.ParseEntry(make([]byte, pack.EntrySize-1)); !errors.Is(err, pack.ErrFormat) {
		t.Errorf("ParseEntry of a short entry = %v, want ErrFormat", err)
	}
	zstdEmpty := pack.AppendEntry(nil, pack.Entry{Offset: 8, Compression: pack.Zstd})
	if _, err := pack.ParseEntry(zstdEmpty); !errors.Is(err, pack.ErrFormat) {
		t.Errorf("ParseEntry of an empty zstd blob = %v, want ErrFormat", err)
	}
}

type failWriter struct{ n int }

var errDisk = errors.New("disk full")

func (w *failWriter) Write(b []byte) (int, error) {
	if w.n < len(b) {
		n := w.n
		w.n = 0
		return n, errDisk
	}
	w.n -= len(b)
	return len(b), nil
}

func TestWriterErrors(t *testing.T) {
	t.Run("write error is sticky", func(t *testing.T) {
		w := pack.NewWriter(&failWriter{n: 20})
		if _, err := w.Add([32]byte{1}, make([]byte, 100), 100, pack.None); !errors.Is(err, errDisk) {
			t.Fatalf("Add = %v, want %v", err, errDisk)
		}
		if _, err := w.Add([32]byte{2}, []byte("x"), 1, pack.None); !errors.Is(err, errDisk) {
			t.Fatalf("second Add = %v, want %v", err, errDisk)
		}
		if _, err := w.Finish(); !errors.Is(err, errDisk) {
			t.Fatalf("Finish = %v, want %v", err, errDisk)
		}
	})
	t.Run("add after finish", func(t *testing.T) {
		w := pack.NewWriter(io.Discard)
		if _, err := w.Finish(); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Add([32]byte{}, nil, 0, pack.None); !errors.Is(err, pack.ErrFinished) {
			t.Fatalf("Add after Finish = %v, want ErrFinished", err)
		}
	})
	t.Run("invalid blob", func(t *testing.T) {
		w := pack.NewWriter(io.Discard)
		if _, err := w.Add([32]byte{}, []byte("abc"), 4, pack.None); !errors.Is(err, pack.ErrFormat) {
			t.Fatalf("Add with a raw length mismatch = %v, want ErrFormat", err)
		}
		if _, err := w.Add([32]byte{}, []byte("abc"), pack.MaxBlobSize+1, pack.Zstd); err == nil {
			t.Fatal("Add of a too large chunk succeeded")
		}
		if w.Len() != 0 {
			t.Fatalf("Len() = %d after rejected blobs", w.Len())
		}
	})
}
