package human_test

import (
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/human"
)

func TestTailWriter(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		n    int
		want string
	}{
		{[]string{"a\nb\nc\n"}, 2, "b\nc\n"},
		{[]string{"a\nb", "\nc"}, 2, "b\nc"},
		{[]string{"a\n", "b\n"}, 5, "a\nb\n"},
		{[]string{"a\nb\n"}, 0, ""},
		{[]string{"", "x"}, 1, "x"},
	} {
		var b strings.Builder
		tw := &human.TailWriter{W: &b, N: tc.n}
		for _, s := range tc.in {
			tw.Write([]byte(s))
		}
		if err := tw.Flush(); err != nil || b.String() != tc.want {
			t.Errorf("tail -n %d of %q: %q, want %q", tc.n, tc.in, b.String(), tc.want)
		}
	}
}
