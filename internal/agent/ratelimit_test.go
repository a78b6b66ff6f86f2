package agent

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"
)

func TestRateReader(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 3<<20)
	start := time.Now()
	n, err := io.Copy(io.Discard, newRateReader(context.Background(), bytes.NewReader(data), 4<<20))
	took := time.Since(start)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("copied %d bytes: %v", n, err)
	}
	// 3 MiB at 4 MiB/s: 0.75 s, give or take scheduling.
	if took < 700*time.Millisecond || took > 2*time.Second {
		t.Fatalf("3 MiB at 4 MiB/s took %s, want about 750ms", took)
	}
	// No limit: as fast as it goes.
	start = time.Now()
	if _, err := io.Copy(io.Discard, newRateReader(context.Background(), bytes.NewReader(data), 0)); err != nil || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("unlimited copy: %v in %s", err, time.Since(start))
	}
	// Cancelled: it stops waiting.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := io.Copy(io.Discard, newRateReader(ctx, bytes.NewReader(data), 1024)); err == nil {
		t.Fatal("a cancelled limited copy ended without error")
	}
}
