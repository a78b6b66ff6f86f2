package failpoint

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSet: a point is set by its name among CAIRN_FAILPOINT's, and with
// CAIRN_FAILPOINT_ARMED only while the file exists, empty or naming it.
func TestSet(t *testing.T) {
	armed := filepath.Join(t.TempDir(), "armed")
	t.Setenv(Env, "a,b")
	t.Setenv(ArmedEnv, "")
	if !Set("a") || !Set("b") || Set("c") || Set("") {
		t.Fatalf("without a file: a %v b %v c %v", Set("a"), Set("b"), Set("c"))
	}
	t.Setenv(ArmedEnv, armed)
	if Set("a") {
		t.Fatal("a is set with its armed file missing")
	}
	for content, want := range map[string][2]bool{"": {true, true}, "b\n": {false, true}, "a b": {true, true}, "c": {false, false}} {
		if err := os.WriteFile(armed, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := [2]bool{Set("a"), Set("b")}; got != want {
			t.Errorf("armed %q: a, b set %v, want %v", content, got, want)
		}
	}
}

// TestHoldUntilDisarmed: a held point goes on once its file is removed.
func TestHoldUntilDisarmed(t *testing.T) {
	armed := filepath.Join(t.TempDir(), "armed")
	if err := os.WriteFile(armed, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(Env, "p")
	t.Setenv(ArmedEnv, armed)
	done := make(chan struct{})
	go func() { Hold(context.Background(), "p", nil); close(done) }()
	select {
	case <-done:
		t.Fatal("Hold returned while armed")
	case <-time.After(200 * time.Millisecond):
	}
	if err := os.Remove(armed); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Hold still held 5s after the point was disarmed")
	}
}
