package chunker_test

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/chunker"
)

func TestParamsValidate(t *testing.T) {
	tests := []struct {
		name string
		p    chunker.Params
		ok   bool
	}{
		{"default", chunker.DefaultParams, true},
		{"small", smallParams, true},
		{"fixed page", chunker.Fixed(chunker.PageSize), true},
		{"fixed 64KiB", chunker.Fixed(64 << 10), true},
		{"fixed max", chunker.Fixed(chunker.MaxLimit), true},
		{"min equals avg", chunker.Params{Min: 4096, Avg: 4096, Max: 8192}, true},
		{"fixed zero", chunker.Fixed(0), false},
		{"fixed negative", chunker.Fixed(-4096), false},
		{"fixed unaligned", chunker.Fixed(5000), false},
		{"fixed too large", chunker.Fixed(chunker.MaxLimit + chunker.PageSize), false},
		{"fixed avg differs", chunker.Params{Min: 4096, Avg: 8192, Max: 4096}, false},
		{"zero", chunker.Params{}, false},
		{"min below window", chunker.Params{Min: 32, Avg: 1024, Max: 4096}, false},
		{"avg not power of two", chunker.Params{Min: 1024, Avg: 3000, Max: 8192}, false},
		{"avg too small", chunker.Params{Min: 64, Avg: 128, Max: 1024}, false},
		{"min above avg", chunker.Params{Min: 8192, Avg: 4096, Max: 16384}, false},
		{"avg above max", chunker.Params{Min: 1024, Avg: 8192, Max: 4096}, false},
		{"max too large", chunker.Params{Min: 1024, Avg: 8192, Max: chunker.MaxLimit + 1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			if tc.ok && err != nil {
				t.Fatalf("Validate(%+v) = %v, want nil", tc.p, err)
			}
			if !tc.ok && !errors.Is(err, chunker.ErrInvalidParams) {
				t.Fatalf("Validate(%+v) = %v, want ErrInvalidParams", tc.p, err)
			}
		})
	}
}

func TestNewPanicsOnInvalidParams(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New with invalid params did not panic")
		}
	}()
	chunker.New(bytes.NewReader(nil), chunker.Fixed(100))
}

// TestChunksCoverInput checks for many inputs and readers that the chunks
// concatenate to the input, respect the size limits, and do not depend on how
// the reader splits its reads.
func TestChunksCoverInput(t *testing.T) {
	params := []struct {
		name string
		p    chunker.Params
	}{
		{"default", chunker.DefaultParams},
		{"small", smallParams},
		{"fixed", chunker.Fixed(chunker.PageSize)},
	}
	inputs := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"one byte", []byte{42}},
		{"random 100KiB+3", randData(10, 100<<10+3)},
		{"random 3MiB", randData(11, 3<<20)},
		{"zeros 1MiB", make([]byte, 1<<20)},
		{"mixed", append(append(randData(12, 300<<10), make([]byte, 2<<20)...), randData(13, 500<<10)...)},
	}
	readers := []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{
		{"bulk", func(r io.Reader) io.Reader { return r }},
		{"half", iotest.HalfReader},
		{"data+EOF", iotest.DataErrReader},
	}
	for _, pc := range params {
		for _, in := range inputs {
			want := chunkAll(t, in.data, pc.p)
			for _, rc := range readers {
				t.Run(pc.name+"/"+in.name+"/"+rc.name, func(t *testing.T) {
					c := chunker.New(rc.wrap(bytes.NewReader(in.data)), pc.p)
					var joined []byte
					var got []golden
					for {
						ch, err := c.Next(nil)
						if err == io.EOF {
							break
						}
						if err != nil {
							t.Fatalf("Next: %v", err)
						}
						if ch.Start != uint64(len(joined)) || ch.Length != len(ch.Data) {
							t.Fatalf("chunk start %d length %d with %d bytes after %d bytes", ch.Start, ch.Length, len(ch.Data), len(joined))
						}
						if ch.Length > pc.p.Max || ch.Length == 0 {
							t.Fatalf("chunk at %d has length %d, max %d", ch.Start, ch.Length, pc.p.Max)
						}
						last := int(ch.Start)+ch.Length == len(in.data)
						if ch.Length < pc.p.Min && !last {
							t.Fatalf("chunk at %d has length %d below min %d", ch.Start, ch.Length, pc.p.Min)
						}
						joined = append(joined, ch.Data...)
						got = append(got, golden{Start: ch.Start, Length: ch.Length})
					}
					if !bytes.Equal(joined, in.data) {
						t.Fatalf("chunks join to %d bytes that differ from the %d input bytes", len(joined), len(in.data))
					}
					for i := range want {
						want[i].ID = ""
					}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("boundaries depend on the reader (-bulk +%s):\n%s", rc.name, diff)
					}
					if _, err := c.Next(nil); err != io.EOF {
						t.Errorf("Next after EOF = %v, want io.EOF", err)
					}
				})
			}
		}
	}
}

func TestOneByteReader(t *testing.T) {
	data := randData(20, 200<<10)
	want := chunkAll(t, data, smallParams)
	c := chunker.New(iotest.OneByteReader(bytes.NewReader(data)), smallParams)
	var got []golden
	for {
		ch, err := c.Next(nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, golden{ch.Start, ch.Length, ""})
	}
	for i := range want {
		want[i].ID = ""
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("boundaries differ (-bulk +one byte):\n%s", diff)
	}
}

func TestFixedChunksArePageAligned(t *testing.T) {
	const size = 16 << 10
	data := randData(30, 10*size+123)
	got := chunkAll(t, data, chunker.Fixed(size))
	if len(got) != 11 {
		t.Fatalf("got %d chunks, want 11", len(got))
	}
	for i, g := range got[:10] {
		if g.Start != uint64(i*size) || g.Length != size {
			t.Errorf("chunk %d: start %d length %d, want %d %d", i, g.Start, g.Length, i*size, size)
		}
	}
	if last := got[10]; last.Length != 123 {
		t.Errorf("last chunk length %d, want 123", last.Length)
	}
}

// TestBoundariesStableUnderInsertion checks the point of content-defined
// chunking: bytes inserted near the start of a stream change the chunks
// around the insertion only.
func TestBoundariesStableUnderInsertion(t *testing.T) {
	for _, p := range []chunker.Params{chunker.DefaultParams, smallParams} {
		orig := randData(40, 6<<20)
		for _, insert := range []int{1, 7, 4096, 100000} {
			edited := append(append(append([]byte(nil), orig[:1000]...), randData(41, insert)...), orig[1000:]...)
			before := ids(chunkAll(t, orig, p))
			after := chunkAll(t, edited, p)
			var changed, changedBytes int
			for _, g := range after {
				if !before[g.ID] {
					changed++
					changedBytes += g.Length
				}
			}
			t.Logf("params %+v, %d bytes inserted: %d of %d chunks (%d bytes) changed", p, insert, changed, len(after), changedBytes)
			// Boundaries resynchronise within a few chunks of the insertion:
			// a cut is taken only at least Min after the previous one, and
			// the mask depends on the distance to it, so a shifted cut can
			// shift the next one too, but the chain ends quickly.
			if changedBytes > insert+3*p.Max {
				t.Errorf("params %+v, %d bytes inserted: %d of %d chunks (%d bytes) changed", p, insert, changed, len(after), changedBytes)
			}
		}
	}
}

func ids(gs []golden) map[string]bool {
	m := make(map[string]bool, len(gs))
	for _, g := range gs {
		m[g.ID] = true
	}
	return m
}

func TestChunkSizeDistribution(t *testing.T) {
	data := randData(50, 32<<20)
	got := chunkAll(t, data, chunker.DefaultParams)
	mean := len(data) / len(got)
	// Normalized chunking keeps the mean near Avg, a little above it
	// because no cut comes before Min.
	if mean < chunker.AvgSize*3/4 || mean > chunker.AvgSize*3/2 {
		t.Errorf("mean chunk size %d for avg %d", mean, chunker.AvgSize)
	}
	var atMax int
	for _, g := range got {
		if g.Length == chunker.MaxSize {
			atMax++
		}
	}
	if atMax > len(got)/50 {
		t.Errorf("%d of %d chunks cut at max size", atMax, len(got))
	}
}

func TestNextReusesBuffer(t *testing.T) {
	data := randData(60, 300<<10)
	c := chunker.New(bytes.NewReader(data), smallParams)
	buf := make([]byte, smallParams.Max)
	ch, err := c.Next(buf)
	if err != nil {
		t.Fatal(err)
	}
	if &ch.Data[0] != &buf[0] {
		t.Error("Next did not store the chunk in the buffer it was given")
	}
	small := make([]byte, 10)
	ch, err = c.Next(small)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ch.Data, data[ch.Start:ch.Start+uint64(ch.Length)]) {
		t.Error("chunk data differs from input when the buffer is too small")
	}
}

func TestReadErrorIsReturned(t *testing.T) {
	errBoom := errors.New("boom")
	r := io.MultiReader(bytes.NewReader(randData(70, 10<<10)), iotest.ErrReader(errBoom))
	c := chunker.New(r, smallParams)
	for i := 0; i < 2; i++ {
		if _, err := c.Next(nil); !errors.Is(err, errBoom) {
			t.Fatalf("call %d: Next = %v, want %v", i, err, errBoom)
		}
	}
}

func TestReset(t *testing.T) {
	a, b := randData(80, 500<<10), randData(81, 700<<10)
	c := chunker.New(bytes.NewReader(a), smallParams)
	if _, err := c.Next(nil); err != nil {
		t.Fatal(err)
	}
	c.Reset(bytes.NewReader(b))
	var got []golden
	for {
		ch, err := c.Next(nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, golden{ch.Start, ch.Length, ""})
	}
	want := chunkAll(t, b, smallParams)
	for i := range want {
		want[i].ID = ""
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("chunks after Reset (-want +got):\n%s", diff)
	}
}
