package agent

import (
	"bytes"
	"context"
	"io"
	"testing"
	"testing/synctest"
	"time"
)

// TestRateReader keeps a copy to its rate, in the virtual time of a
// synctest bubble: the limited copy of 3 MiB at 4 MiB/s takes 750 ms (the
// last 64 KiB read is counted when it is read: one read's time of slack),
// an unlimited one takes no time, and a cancelled one stops waiting.
func TestRateReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		data := bytes.Repeat([]byte("x"), 3<<20)
		start := time.Now()
		n, err := io.Copy(io.Discard, newRateReader(context.Background(), bytes.NewReader(data), 4<<20))
		took := time.Since(start)
		if err != nil || n != int64(len(data)) {
			t.Fatalf("copied %d bytes: %v", n, err)
		}
		if step := (64 << 10) * time.Second / (4 << 20); took < 750*time.Millisecond-step || took > 750*time.Millisecond {
			t.Fatalf("3 MiB at 4 MiB/s took %s, want 750ms less at most one 64 KiB read (%s)", took, step)
		}
		start = time.Now()
		if _, err := io.Copy(io.Discard, newRateReader(context.Background(), bytes.NewReader(data), 0)); err != nil || time.Since(start) != 0 {
			t.Fatalf("unlimited copy: %v in %s", err, time.Since(start))
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := io.Copy(io.Discard, newRateReader(ctx, bytes.NewReader(data), 1024)); err == nil {
			t.Fatal("a cancelled limited copy ended without error")
		}
	})
}
