package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestHealth: each probe fails when it should and says why; a change of
// the failing set is reported once.
func TestHealth(t *testing.T) {
	dir := t.TempDir()
	flag := filepath.Join(dir, "sick")
	h := NewHealth(HealthConfig{
		Every: 20 * time.Millisecond, Node: "n7",
		Command: `if [ -e ` + flag + ` ]; then echo "$CAIRN_NODE is sick"; exit 1; fi`,
		DataDir: dir, MinFreeDisk: 1.01, // never enough
	})
	w := h.Check(context.Background())
	if len(w) != 1 || !strings.HasPrefix(w[0], "disk: ") {
		t.Fatalf("warnings %q, want the disk probe only", w)
	}
	h.cfg.MinFreeDisk = 0
	if w := h.Check(context.Background()); len(w) != 0 {
		t.Fatalf("healthy node warns %q", w)
	}
	changes := make(chan []string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.Run(ctx, func(w []string) { changes <- w })
	if w := <-changes; len(w) != 0 {
		t.Fatalf("first report %q", w)
	}
	os.WriteFile(flag, nil, 0o600)
	if w := <-changes; !slices.Equal(w, []string{"command: n7 is sick"}) {
		t.Fatalf("sick node reports %q", w)
	}
	os.Remove(flag)
	if w := <-changes; len(w) != 0 {
		t.Fatalf("recovered node reports %q", w)
	}
	select {
	case w := <-changes:
		t.Fatalf("a report without a change: %q", w)
	case <-time.After(100 * time.Millisecond):
	}
	mem := NewHealth(HealthConfig{MinFreeMemory: 1.01})
	if w := mem.Check(context.Background()); len(w) != 1 || !strings.HasPrefix(w[0], "memory: ") {
		t.Fatalf("memory probe: %q", w)
	}
}
