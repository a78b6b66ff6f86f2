package human_test

import (
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/human"
)

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"},
		{5 << 20, "5.0 MiB"}, {3 << 30, "3.0 GiB"}, {1 << 60, "1.0 EiB"},
	} {
		if got := human.Bytes(tc.n); got != tc.want {
			t.Errorf("Bytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{1234 * time.Nanosecond, "1µs"}, {1234567 * time.Nanosecond, "1.2ms"},
		{1234567891 * time.Nanosecond, "1.23s"},
	} {
		if got := human.Duration(tc.d); got != tc.want {
			t.Errorf("Duration(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestAgo(t *testing.T) {
	if got := human.Ago(time.Time{}); got != "-" {
		t.Errorf("Ago(zero) = %q", got)
	}
	if got := human.Ago(time.Now().Add(-90 * time.Minute)); got != "1h ago" {
		t.Errorf("Ago(90m) = %q", got)
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "512": 512, "4k": 4 << 10, "50M": 50 << 20, "2G": 2 << 30} {
		if got, err := human.ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "M", "-1", "1.5G", "1T"} {
		if _, err := human.ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) accepted", in)
		}
	}
}

func TestBar(t *testing.T) {
	var b strings.Builder
	progress, done := human.Bar(&b, "copying", "chunks")
	progress(5, 10)
	done()
	if s := b.String(); !strings.Contains(s, "copying [===============               ]  50% 5/10 chunks") || !strings.HasSuffix(s, "\r\033[K") {
		t.Errorf("bar: %q", s)
	}
}

func TestPlural(t *testing.T) {
	if got := human.Plural(1, "rank") + ", " + human.Plural(0, "rank") + ", " + human.Plural(3, "rank"); got != "1 rank, 0 ranks, 3 ranks" {
		t.Errorf("plurals: %q", got)
	}
}
