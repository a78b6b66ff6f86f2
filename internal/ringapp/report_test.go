package ringapp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
	"github.com/cairn-hpc/cairn/internal/ringapp"
)

// TestReportsProgress: rank 0 publishes its progress through the rank
// API's socket, off the ring's path; the run's result is what it would
// be without. A socket that is not there costs the run nothing.
func TestReportsProgress(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "rank.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var got []rankv1.Request
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			line, err := bufio.NewReader(conn).ReadBytes('\n')
			var req rankv1.Request
			if err == nil && json.Unmarshal(line, &req) == nil {
				mu.Lock()
				got = append(got, req)
				mu.Unlock()
			}
			conn.Write([]byte(`{"ok":true}` + "\n"))
			conn.Close()
		}
	}()

	for _, socket := range []string{sock, filepath.Join(t.TempDir(), "none.sock")} {
		const size, messages = 2, 300_000
		lns := make([]net.Listener, size)
		addrs := make([]string, size)
		for r := range lns {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			lns[r], addrs[r] = l, l.Addr().String()
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		var wg sync.WaitGroup
		results := make([]string, size)
		errs := make([]error, size)
		for r := range size {
			wg.Go(func() {
				cfg := ringapp.Config{Job: "test", Rank: r, Size: size, Addrs: addrs, Listener: lns[r], Messages: messages,
					Window: 64, Payload: 64, Seed: 1, ConnectTimeout: 10 * time.Second, Progress: 10 * time.Millisecond}
				if r == 0 {
					cfg.Socket = socket
				}
				results[r], errs[r] = ringapp.Run(ctx, cfg)
				if errs[r] != nil {
					cancel()
				}
			})
		}
		wg.Wait()
		cancel()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		if want := ringapp.Expected(size, messages, 64, 1); results[0] != want {
			t.Fatalf("result %s, want %s", results[0], want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) < 3 {
		t.Fatalf("%d progress reports, want several", len(got))
	}
	last := 0
	for _, req := range got {
		n, err := strconv.Atoi(req.Message)
		if req.Op != rankv1.OpEvent || req.Kind != rankv1.KindProgress || err != nil || n <= last || n > 300_000 {
			t.Fatalf("report %+v after %d: want a progress event with a growing count", req, last)
		}
		last = n
	}
}
