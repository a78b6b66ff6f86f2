package rpc

import (
	"errors"
	"strings"
	"sync"
	"testing"

	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
)

// TestLabelled: every line of every rank is written whole after its
// rank's label, a last line without its newline too.
func TestLabelled(t *testing.T) {
	var b strings.Builder
	l := &labelled{w: &b}
	var wg sync.WaitGroup
	for r, in := range []string{"a\nb\n", "c\nlast without newline"} {
		wg.Go(func() {
			if err := l.copy(r, strings.NewReader(in)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got := map[string]bool{}
	for _, line := range strings.SplitAfter(b.String(), "\n") {
		got[line] = true
	}
	for _, want := range []string{"0: a\n", "0: b\n", "1: c\n", "1: last without newline\n"} {
		if !got[want] {
			t.Errorf("no line %q in:\n%s", want, b.String())
		}
	}
	if !strings.HasSuffix(b.String(), "\n") || strings.Count(b.String(), "\n") != 4 {
		t.Errorf("want 4 whole lines, got:\n%s", b.String())
	}
}

// TestEachEvent: every event of a stream is handed on with its line; a
// line that is no event ends the stream with a badEventError.
func TestEachEvent(t *testing.T) {
	var seqs []uint64
	var lines []string
	fn := func(e evv1.Event, line []byte) { seqs, lines = append(seqs, e.Seq), append(lines, string(line)) }
	n, last, err := eachEvent(strings.NewReader(`{"seq":3,"type":"node.joined"}`+"\n"+`{"seq":5,"type":"node.dead"}`+"\n"), fn)
	if err != nil || n != 2 || last != 5 || len(seqs) != 2 || seqs[0] != 3 || lines[1] != `{"seq":5,"type":"node.dead"}` {
		t.Fatalf("eachEvent: %d %d %v; %v %q", n, last, err, seqs, lines)
	}
	n, last, err = eachEvent(strings.NewReader(`{"seq":6}`+"\nnot json\n"+`{"seq":7}`+"\n"), fn)
	var bad badEventError
	if !errors.As(err, &bad) || n != 1 || last != 6 {
		t.Errorf("a bad line: %d %d %v", n, last, err)
	}
}
