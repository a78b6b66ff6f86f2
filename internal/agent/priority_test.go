package agent

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// threadNice reads the nice value of the calling OS thread.
func threadNice(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name: state is field 3, nice field 19.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	n, err := strconv.Atoi(f[19-3])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestInBackground: fn runs at nice 19; the caller's thread, and threads
// that goroutines started meanwhile run on, keep normal priority.
func TestInBackground(t *testing.T) {
	var inside int
	var others []int
	var mu sync.Mutex
	err := inBackground(func() error {
		inside = threadNice(t)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				n := threadNice(t)
				mu.Lock()
				others = append(others, n)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside != 19 {
		t.Errorf("fn ran at nice %d, want 19", inside)
	}
	for _, n := range others {
		if n != 0 {
			t.Errorf("a goroutine started by fn ran at nice %d, want 0", n)
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if n := threadNice(t); n != 0 {
		t.Errorf("the caller's thread is at nice %d afterwards", n)
	}
}
