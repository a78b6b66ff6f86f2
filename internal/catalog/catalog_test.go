package catalog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/catalog"
)

type record struct {
	Name  string            `json:"name"`
	State string            `json:"state,omitempty"`
	N     int               `json:"n,omitempty"`
	Tags  map[string]string `json:"tags,omitempty"`
}

func TestCRUD(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)

	var got record
	if _, err := c.Get(ctx, "jobs/a", &got); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}

	want := record{Name: "a", State: "running", Tags: map[string]string{"x": "1"}}
	if err := c.Create(ctx, "jobs/a", want); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := c.Create(ctx, "jobs/a", record{Name: "other"}); !errors.Is(err, catalog.ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	rev1, err := c.Get(ctx, "jobs/a", &got)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Get after Create (-want +got):\n%s", diff)
	}

	// Put replaces the whole value: Get must not keep the old tags in got.
	want = record{Name: "a", State: "done"}
	if err := c.Put(ctx, "jobs/a", want); err != nil {
		t.Fatalf("Put: %v", err)
	}
	rev2, err := c.Get(ctx, "jobs/a", &got)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Get after Put (-want +got):\n%s", diff)
	}
	if rev2 <= rev1 {
		t.Errorf("mod revision went from %d to %d after Put", rev1, rev2)
	}

	if err := c.Delete(ctx, "jobs/a"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := c.Delete(ctx, "jobs/a"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("second Delete: %v, want ErrNotFound", err)
	}
	if _, err := c.Get(ctx, "jobs/a", &got); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	// Create works again once the key is gone.
	if err := c.Create(ctx, "jobs/a", want); err != nil {
		t.Fatalf("Create after Delete: %v", err)
	}
}

func TestInvalidKeys(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	var v record
	for _, key := range []string{"", "/jobs/a"} {
		if err := c.Put(ctx, key, v); err == nil {
			t.Errorf("Put(%q) succeeded", key)
		}
		if _, err := c.Get(ctx, key, &v); err == nil || errors.Is(err, catalog.ErrNotFound) {
			t.Errorf("Get(%q) = %v, want an invalid key error", key, err)
		}
	}
	if _, err := c.DeletePrefix(ctx, ""); err == nil {
		t.Error("DeletePrefix(\"\") succeeded")
	}
	if _, err := c.Get(ctx, "jobs/a", v); err == nil {
		t.Error("Get into a non-pointer succeeded")
	}
	if e := nextEvent(t, c.Watch(ctx, "/jobs/", 0), 5*time.Second); e.Err == nil {
		t.Errorf("Watch of an absolute prefix: %+v, want an error", e)
	}
}

func TestUpdateConcurrent(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	if err := c.Create(ctx, "counter", record{Name: "counter"}); err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 25
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		attempts int
	)
	for range workers {
		wg.Go(func() {
			for range each {
				var r record
				err := c.Update(ctx, "counter", &r, func() error {
					mu.Lock()
					attempts++
					mu.Unlock()
					r.N++
					return nil
				})
				if err != nil {
					t.Errorf("Update: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	var r record
	if _, err := c.Get(ctx, "counter", &r); err != nil {
		t.Fatal(err)
	}
	if r.N != workers*each {
		t.Fatalf("counter = %d after %d increments", r.N, workers*each)
	}
	t.Logf("%d increments took %d attempts", workers*each, attempts)
}

func TestUpdateStopsOnError(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	if err := c.Create(ctx, "jobs/a", record{Name: "a", State: "running"}); err != nil {
		t.Fatal(err)
	}
	stop := errors.New("stop")
	var r record
	err := c.Update(ctx, "jobs/a", &r, func() error {
		r.State = "changed"
		return stop
	})
	if !errors.Is(err, stop) {
		t.Fatalf("Update = %v, want fn's error", err)
	}
	if _, err := c.Get(ctx, "jobs/a", &r); err != nil || r.State != "running" {
		t.Fatalf("after a stopped Update: %+v, %v; want it unchanged", r, err)
	}
	if err := c.Update(ctx, "jobs/missing", &r, func() error { return nil }); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("Update of a missing key = %v, want ErrNotFound", err)
	}
}

// TestTxnCommitDecision plays the checkpoint decision: the commit writes
// the checkpoint record and the job record only if the checkpoint is still
// at the revision it was read at.
func TestTxnCommitDecision(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	const ckpt, job = "ckpts/j/000001", "jobs/j"
	if err := c.Create(ctx, ckpt, record{Name: "1", State: "preparing"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, job, record{Name: "j"}); err != nil {
		t.Fatal(err)
	}

	decide := func(state string) (int64, error) {
		var r record
		rev, err := c.Get(ctx, ckpt, &r)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != "preparing" {
			return 0, fmt.Errorf("already %s", r.State)
		}
		r.State = state
		return c.Txn(ctx, []catalog.Cond{catalog.IfRevision(ckpt, rev)},
			catalog.PutOp(ckpt, r), catalog.PutOp(job, record{Name: "j", State: "last " + state}))
	}

	// A stale read: an abort lands between the commit's read and its write.
	var stale record
	rev, err := c.Get(ctx, ckpt, &stale)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decide("aborted"); err != nil {
		t.Fatalf("abort: %v", err)
	}
	stale.State = "committed"
	_, err = c.Txn(ctx, []catalog.Cond{catalog.IfRevision(ckpt, rev)},
		catalog.PutOp(ckpt, stale), catalog.PutOp(job, record{Name: "j", State: "last committed"}))
	if !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("commit on a stale revision = %v, want ErrConflict", err)
	}
	// Nothing of the refused transaction was written.
	var r record
	if _, err := c.Get(ctx, job, &r); err != nil || r.State != "last aborted" {
		t.Fatalf("job after refused commit: %+v, %v", r, err)
	}
	if _, err := c.Get(ctx, ckpt, &r); err != nil || r.State != "aborted" {
		t.Fatalf("ckpt after refused commit: %+v, %v", r, err)
	}

	// A fresh checkpoint commits, and the revision returned is the key's.
	const ckpt2 = "ckpts/j/000002"
	if _, err := c.Txn(ctx, []catalog.Cond{catalog.IfAbsent(ckpt2)}, catalog.PutOp(ckpt2, record{State: "preparing"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Txn(ctx, []catalog.Cond{catalog.IfAbsent(ckpt2)}, catalog.PutOp(ckpt2, record{})); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("IfAbsent on a present key = %v, want ErrConflict", err)
	}
	var r2 record
	rev, _ = c.Get(ctx, ckpt2, &r2)
	r2.State = "committed"
	newRev, err := c.Txn(ctx, []catalog.Cond{catalog.IfRevision(ckpt2, rev)}, catalog.PutOp(ckpt2, r2), catalog.DeleteOp(ckpt))
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	if got, _ := c.Get(ctx, ckpt2, &r2); got != newRev || r2.State != "committed" {
		t.Fatalf("after commit: rev %d state %q, want rev %d committed", got, r2.State, newRev)
	}
	if _, err := c.Get(ctx, ckpt, &r); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("deleted in txn: %v", err)
	}
}

func TestListAndDeletePrefix(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	// More keys than one page of List, and neighbours that share the
	// prefix without the slash.
	const n = 600
	var want []string
	for i := range n {
		key := fmt.Sprintf("jobs/%04d", i)
		want = append(want, key)
		if err := c.Put(ctx, key, record{Name: key, N: i}); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{"jobsets/x", "job", "nodes/a"} {
		if err := c.Put(ctx, key, record{Name: key}); err != nil {
			t.Fatal(err)
		}
	}

	var got []string
	var mid int64
	rev, err := c.List(ctx, "jobs/", func(key string, raw []byte) error {
		got = append(got, key)
		if len(got) == n/2 {
			// A write during the listing is not seen: List is a snapshot.
			var err error
			if err = c.Put(ctx, "jobs/0000", record{Name: "changed"}); err != nil {
				return err
			}
			if mid, err = c.Get(ctx, "jobs/0000", &record{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("List keys (-want +got):\n%s", diff)
	}
	if rev >= mid {
		t.Fatalf("List revision %d not before the write at %d made during it", rev, mid)
	}

	stop := errors.New("stop")
	calls := 0
	if _, err := c.List(ctx, "", func(string, []byte) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("List with each failing: %v after %d calls", err, calls)
	}

	deleted, err := c.DeletePrefix(ctx, "jobs/")
	if err != nil || deleted != n {
		t.Fatalf("DeletePrefix = %d, %v; want %d", deleted, err, n)
	}
	got = nil
	if _, err := c.List(ctx, "", func(key string, _ []byte) error { got = append(got, key); return nil }); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"job", "jobsets/x", "nodes/a"}, got); diff != "" {
		t.Fatalf("keys left (-want +got):\n%s", diff)
	}
}

func TestWatch(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	if err := c.Put(ctx, "jobs/before", record{Name: "before"}); err != nil {
		t.Fatal(err)
	}
	rev, err := c.List(ctx, "jobs/", func(string, []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	// Written after the List but before the Watch: seen because the watch
	// starts after the List's revision.
	if err := c.Put(ctx, "jobs/a", record{Name: "a", N: 1}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	events := c.Watch(wctx, "jobs/", rev)

	if err := c.Put(ctx, "nodes/x", record{}); err != nil { // not watched
		t.Fatal(err)
	}
	for i := 2; i <= 20; i++ {
		if err := c.Put(ctx, "jobs/a", record{Name: "a", N: i}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Txn(ctx, nil, catalog.DeleteOp("jobs/a"), catalog.PutOp("jobs/b", record{Name: "b"})); err != nil {
		t.Fatal(err)
	}

	last := rev
	for i := 1; i <= 20; i++ {
		e := nextEvent(t, events, 5*time.Second)
		if e.Err != nil || e.Kind != catalog.EventPut || e.Key != "jobs/a" || e.Rev <= last {
			t.Fatalf("event %d: %+v (after rev %d)", i, e, last)
		}
		var r record
		if err := json.Unmarshal(e.Value, &r); err != nil || r.N != i {
			t.Fatalf("event %d: value %s, want n=%d", i, e.Value, i)
		}
		last = e.Rev
	}
	del := nextEvent(t, events, 5*time.Second)
	put := nextEvent(t, events, 5*time.Second)
	if del.Kind != catalog.EventDelete || del.Key != "jobs/a" || del.Value != nil || put.Kind != catalog.EventPut || put.Key != "jobs/b" {
		t.Fatalf("txn events: %+v, %+v", del, put)
	}
	if del.Rev != put.Rev || del.Rev <= last {
		t.Fatalf("txn events at revisions %d and %d after %d, want one revision", del.Rev, put.Rev, last)
	}

	cancel()
	for e := range events {
		t.Fatalf("event after cancel: %+v", e)
	}
}

func TestWatchCompacted(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	for i := range 3 {
		if err := c.Put(ctx, "jobs/a", record{N: i}); err != nil {
			t.Fatal(err)
		}
	}
	rev, err := c.Get(ctx, "jobs/a", &record{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	events := c.Watch(ctx, "jobs/", 1)
	e := nextEvent(t, events, 5*time.Second)
	if !errors.Is(e.Err, catalog.ErrCompacted) {
		t.Fatalf("watch from a compacted revision: %+v, want ErrCompacted", e)
	}
	if _, ok := <-events; ok {
		t.Fatal("channel not closed after the error event")
	}
}

// TestWritten counts the puts that took effect and their bytes: a
// transaction whose condition fails writes nothing.
func TestWritten(t *testing.T) {
	c := newCatalog(t)
	ctx := context.Background()
	if err := c.Put(ctx, "a", "xy"); err != nil { // "xy" is 4 bytes of JSON
		t.Fatal(err)
	}
	if err := c.Create(ctx, "a", 1); !errors.Is(err, catalog.ErrExists) {
		t.Fatalf("create over a: %v", err)
	}
	if err := c.Create(ctx, "b", 12); err != nil {
		t.Fatal(err)
	}
	got := c.Written()
	want := catalog.Written{Puts: 2, Bytes: int64(len(catalog.Root+"a") + 4 + len(catalog.Root+"b") + 2)}
	if got != want {
		t.Fatalf("written %+v, want %+v", got, want)
	}
}
