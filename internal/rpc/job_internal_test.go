package rpc

import (
	"strings"
	"sync"
	"testing"
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
