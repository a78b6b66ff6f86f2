package coord

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestJobLocks: the per-job lock serializes work on one job, not on
// others, tryLock gives up on a busy job, and no entry outlives its last
// holder or waiter, however many names were asked for.
func TestJobLocks(t *testing.T) {
	c := &Coordinator{locks: jobLocks{held: map[string]*jobMutex{}}}
	for i := range 1000 {
		c.locks.lock(fmt.Sprintf("nosuch-%d", i))()
	}
	unlock := c.locks.lock("a")
	if _, ok := c.locks.tryLock("a"); ok {
		t.Fatal("tryLock of a held job succeeded")
	}
	unlockB, ok := c.locks.tryLock("b")
	if !ok {
		t.Fatal("tryLock of another job failed")
	}
	unlockB()
	var wg sync.WaitGroup
	got := make(chan int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.locks.lock("a")()
			got <- i
		}()
	}
	select {
	case <-got:
		t.Fatal("a waiter got a held lock")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	wg.Wait()
	if len(got) != 2 {
		t.Fatalf("%d waiters got the lock, want 2", len(got))
	}
	c.locks.mu.Lock()
	defer c.locks.mu.Unlock()
	if len(c.locks.held) != 0 {
		t.Fatalf("%d lock entries left, want 0", len(c.locks.held))
	}
}
