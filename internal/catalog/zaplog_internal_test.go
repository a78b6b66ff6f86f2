package catalog

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

func TestLogFileRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "etcd.log")
	l, err := openLogFile(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	line := []byte(strings.Repeat("x", 39) + "\n")
	for range 7 { // 280 bytes: two rotations, 40 bytes left in the file
		if _, err := l.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Write(line); err != nil { // after Close: dropped
		t.Fatal(err)
	}
	for name, want := range map[string]int{path: 40, path + ".1": 80} {
		b, err := os.ReadFile(name)
		if err != nil || len(b) != want {
			t.Errorf("%s: %d bytes (%v), want %d", filepath.Base(name), len(b), err, want)
		}
	}
}

func TestSlogZap(t *testing.T) {
	var buf bytes.Buffer
	lg := newSlogZap(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	lg.Named("raft").With(zap.String("member", "m1")).Warn("slow", zap.Int("ms", 12))
	got := buf.String()
	for _, want := range []string{"level=DEBUG", "msg=slow", "member=m1", "logger=raft", "etcd_level=warn", "ms=12"} {
		if !strings.Contains(got, want) {
			t.Errorf("record %q lacks %q", got, want)
		}
	}
	// At Info, the handler takes nothing.
	buf.Reset()
	newSlogZap(slog.New(slog.NewTextHandler(&buf, nil))).Error("dropped")
	if buf.Len() != 0 {
		t.Errorf("Info handler got %q", buf.String())
	}
}
