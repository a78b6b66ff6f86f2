package v1_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

// TestRepliesOnce: a request sent again with its ID gets the first reply
// and is not carried out again, even while the first still runs; another
// ID, another op with the same ID, or no ID is carried out.
func TestRepliesOnce(t *testing.T) {
	var r rankv1.Replies
	var ran atomic.Int32
	release := make(chan struct{})
	do := func(ticket string) func() rankv1.Reply {
		return func() rankv1.Reply {
			ran.Add(1)
			<-release
			return rankv1.Reply{OK: true, Ticket: ticket}
		}
	}
	ck := rankv1.Request{Op: rankv1.OpCheckpoint, ID: "a1"}
	var wg sync.WaitGroup
	got := make([]rankv1.Reply, 3)
	did := make([]bool, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], did[i] = r.Do(t.Context(), ck, do(fmt.Sprint("t", i)))
		}()
	}
	time.Sleep(50 * time.Millisecond) // all three are in Do
	close(release)
	wg.Wait()
	if n := ran.Load(); n != 1 {
		t.Fatalf("carried out %d times, want once", n)
	}
	first := 0
	for i := range 3 {
		if did[i] {
			first = i
		}
	}
	for i := range 3 {
		if got[i] != got[first] {
			t.Errorf("reply %d %+v, want the first's %+v", i, got[i], got[first])
		}
	}
	for _, req := range []rankv1.Request{{Op: rankv1.OpCheckpoint, ID: "a2"}, {Op: rankv1.OpEvent, ID: "a1"}, {Op: rankv1.OpCheckpoint}, {Op: rankv1.OpCheckpoint}} {
		if _, did := r.Do(t.Context(), req, do("x")); !did {
			t.Errorf("%+v was not carried out", req)
		}
	}
	if n := ran.Load(); n != 5 {
		t.Errorf("carried out %d times, want 5", n)
	}
}

// TestRepliesWaitBounded: a repeat waits for the first no longer than its
// context, and says so.
func TestRepliesWaitBounded(t *testing.T) {
	var r rankv1.Replies
	release := make(chan struct{})
	defer close(release)
	req := rankv1.Request{Op: rankv1.OpEvent, ID: "e"}
	go r.Do(context.Background(), req, func() rankv1.Reply { <-release; return rankv1.Reply{OK: true} })
	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	reply, did := r.Do(ctx, req, func() rankv1.Reply { t.Error("carried out twice"); return rankv1.Reply{} })
	if did || reply.OK || reply.Code != rankv1.CodeUnavailable {
		t.Errorf("repeat while the first runs past its context: %+v, %v", reply, did)
	}
}

// TestRepliesForget: replies beyond Keep, or older than For, are
// forgotten: their request is carried out again.
func TestRepliesForget(t *testing.T) {
	now := time.Unix(1e9, 0)
	r := rankv1.Replies{Keep: 3, For: time.Minute, Now: func() time.Time { return now }}
	n := 0
	do := func() rankv1.Reply { n++; return rankv1.Reply{OK: true} }
	req := func(id string) rankv1.Request { return rankv1.Request{Op: rankv1.OpEvent, ID: id} }
	for _, id := range []string{"1", "2", "3", "4"} {
		r.Do(t.Context(), req(id), do)
	}
	if _, did := r.Do(t.Context(), req("4"), do); did {
		t.Error("the newest was forgotten")
	}
	if _, did := r.Do(t.Context(), req("1"), do); !did {
		t.Error("the oldest of 4 was kept with Keep 3")
	}
	now = now.Add(2 * time.Minute)
	if _, did := r.Do(t.Context(), req("4"), do); !did {
		t.Error("a reply older than For was kept")
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"": true, "a": true, "0123456789abcdef": true, "A-b_9": true, strings.Repeat("x", rankv1.MaxID): true,
		strings.Repeat("x", rankv1.MaxID+1): false, "a b": false, "a/b": false, "é": false, "a\n": false,
	} {
		if got := rankv1.ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}
