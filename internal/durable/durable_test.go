package durable_test

import (
	"os"
	"path/filepath"
	"testing"

	"cairn/internal/durable"
)

func TestWriteFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	for _, s := range []string{"one", "two, longer"} {
		if err := durable.WriteFile(p, []byte(s)); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != s {
			t.Fatalf("read %q, %v; want %q", b, err, s)
		}
	}
	if _, err := os.Stat(p + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary file left: %v", err)
	}
	if err := durable.WriteFile(filepath.Join(t.TempDir(), "no", "dir"), nil); err == nil {
		t.Fatal("write into a missing dir succeeded")
	}
}
