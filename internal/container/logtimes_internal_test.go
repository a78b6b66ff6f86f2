package container

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/image"
)

// TestStamper: a line takes the time of the last mark at or before its
// first byte, however the writes cut it; lines before the first mark have
// none ("-", and Since leaves them out); Since keeps the lines from its
// time on.
func TestStamper(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	at := func(s int) int64 { return t0.Add(time.Duration(s) * time.Second).UnixNano() }
	log := "zero\none\ntwo-a two-b\nthree\nfour"
	// No mark for "zero"; "one" at 1 s; the mark at 2 s falls inside
	// "two...", which keeps 1 s; "three" at 3 s.
	marks := []mark{{5, at(1)}, {12, at(2)}, {21, at(3)}}
	run := func(o LogOptions) string {
		var out bytes.Buffer
		st := newStamper(&out, o)
		st.add(marks)
		for _, cut := range []int{3, 7, 8, 20, len(log)} { // writes that cut lines
			if _, err := st.Write([]byte(log[st.off:cut])); err != nil {
				t.Fatal(err)
			}
		}
		return out.String()
	}
	want := "- zero\n" +
		"2026-11-29T10:00:01Z one\n" +
		"2026-11-29T10:00:01Z two-a two-b\n" +
		"2026-11-29T10:00:03Z three\n" +
		"2026-11-29T10:00:03Z four"
	if got := run(LogOptions{Timestamps: true}); got != want {
		t.Errorf("timestamps:\n%s\nwant:\n%s", got, want)
	}
	if got := run(LogOptions{Since: t0.Add(2 * time.Second)}); got != "three\nfour" {
		t.Errorf("since 2 s: %q", got)
	}
	if got := run(LogOptions{Since: t0}); got != "one\ntwo-a two-b\nthree\nfour" {
		t.Errorf("since 0 s: %q", got)
	}
}

// TestMarkFile: marks are read as they are written, whole ones only; a
// mark cut short is read once it is whole. keepMarks keeps those of the
// bytes before a cut.
func TestMarkFile(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "x.log")
	f, err := os.OpenFile(image.TimesOf(log), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mf, err := openMarks(log)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	st := newStamper(&bytes.Buffer{}, LogOptions{})
	one, two := mark{0, 100}.encode(), mark{10, 200}.encode()
	f.Write(one)
	f.Write(two[:5])
	if err := mf.more(st); err != nil || len(st.marks) != 1 {
		t.Fatalf("after one mark and a half: %v, %v", st.marks, err)
	}
	f.Write(two[5:])
	if err := mf.more(st); err != nil || len(st.marks) != 2 || st.marks[1] != (mark{10, 200}) {
		t.Fatalf("after two marks: %v, %v", st.marks, err)
	}
	kept := filepath.Join(dir, "kept")
	if err := keepMarks(log, kept, 10); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(kept); !bytes.Equal(b, one) {
		t.Errorf("marks kept before offset 10: %x", b)
	}
	// Marks that go back are refused.
	f.Write(mark{5, 300}.encode())
	if _, err := loadMarks(log); err == nil || !strings.Contains(err.Error(), "after one at 10") {
		t.Errorf("a mark going back: %v", err)
	}
	// A log without times has no marks, and no error.
	if marks, err := loadMarks(filepath.Join(dir, "none.log")); marks != nil || err != nil {
		t.Errorf("no times: %v, %v", marks, err)
	}
}

// TestInstallTimes: a restored log's times are those that came with its
// image for the bytes it has; times from an image that are no log's
// (marks going back, or before offset 0: a crafted import) give it none,
// and neither panic nor fail the restore.
func TestInstallTimes(t *testing.T) {
	dir := t.TempDir()
	history, log := filepath.Join(dir, "history"), filepath.Join(dir, "container.log")
	write := func(marks ...mark) {
		var b []byte
		for _, m := range marks {
			b = append(b, m.encode()...)
		}
		if err := os.WriteFile(image.TimesOf(history), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(mark{0, 100}, mark{10, 200}, mark{50, 300})
	if err := installTimes(log, history, 20); err != nil {
		t.Fatal(err)
	}
	if got, err := loadMarks(log); err != nil || len(got) != 2 || got[1] != (mark{10, 200}) {
		t.Errorf("times of a 20-byte log: %v, %v", got, err)
	}
	for what, marks := range map[string][]mark{
		"going back":    {{10, 100}, {5, 200}},
		"before zero":   {{-1, 100}},
		"far before it": {{0, 100}, {-9, 200}},
	} {
		write(marks...)
		if err := installTimes(log, history, 20); err != nil {
			t.Errorf("%s: %v", what, err)
		}
		if _, err := os.Stat(image.TimesOf(log)); !os.IsNotExist(err) {
			t.Errorf("%s: the log got times (%v)", what, err)
		}
	}
	// No history, no times.
	if err := installTimes(log, "", 0); err != nil {
		t.Fatal(err)
	}
}
