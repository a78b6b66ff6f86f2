package durable_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cairn-hpc/cairn/internal/durable"
)

func TestWriteFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	for _, s := range []string{"one", "two, longer"} {
		if err := durable.WriteFile(p, []byte(s), 0o640); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != s {
			t.Fatalf("read %q, %v; want %q", b, err, s)
		}
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 1 {
		t.Fatalf("temporary file left: %v", ents)
	}
	if err := durable.WriteFile(filepath.Join(t.TempDir(), "no", "dir"), nil, 0o600); err == nil {
		t.Fatal("write into a missing dir succeeded")
	}
}
