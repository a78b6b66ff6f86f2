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
	c := &Coordinator{jobMu: map[string]*jobMutex{}}
	for i := range 1000 {
		c.lockJob(fmt.Sprintf("nosuch-%d", i))()
	}
	unlock := c.lockJob("a")
	if _, ok := c.tryLockJob("a"); ok {
		t.Fatal("tryLock of a held job succeeded")
	}
	unlockB, ok := c.tryLockJob("b")
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
			defer c.lockJob("a")()
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
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.jobMu) != 0 {
		t.Fatalf("%d lock entries left, want 0", len(c.jobMu))
	}
}
