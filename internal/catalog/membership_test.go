package catalog_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/catalog"
)

func TestMembershipExpiry(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	const ttl = 2 * time.Second

	members := c.WatchAlive(ctx)
	m, err := c.Register(ctx, "n1", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if m.TTL() != ttl {
		t.Errorf("granted TTL %v, asked %v", m.TTL(), ttl)
	}
	if ev := nextEvent(t, members, 5*time.Second); ev.Change != catalog.MemberJoined || ev.Name != "n1" {
		t.Fatalf("after Register: %+v", ev)
	}

	// Kept alive for longer than its TTL, the member stays.
	var last time.Time
	for range 6 {
		if err := m.KeepAlive(ctx); err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		last = time.Now()
		time.Sleep(ttl / 4)
	}
	alive, err := c.Alive(ctx)
	if err != nil || !alive["n1"] {
		t.Fatalf("Alive while kept alive: %v, %v", alive, err)
	}

	// Then it stops.
	ev := nextEvent(t, members, ttl+3*time.Second)
	lost := time.Since(last)
	if ev.Change != catalog.MemberLost || ev.Name != "n1" {
		t.Fatalf("after keepalives stopped: %+v", ev)
	}
	t.Logf("lost %v after the last keepalive (TTL %v)", lost.Round(time.Millisecond), ttl)
	if lost < ttl-100*time.Millisecond || lost > ttl+time.Second {
		t.Errorf("lost %v after the last keepalive, want within [%v, %v]", lost, ttl, ttl+time.Second)
	}
	if err := m.KeepAlive(ctx); !errors.Is(err, catalog.ErrLeaseExpired) {
		t.Fatalf("KeepAlive after expiry = %v, want ErrLeaseExpired", err)
	}
	if alive, err := c.Alive(ctx); err != nil || len(alive) != 0 {
		t.Fatalf("Alive after expiry: %v, %v", alive, err)
	}
	if err := m.Revoke(ctx); err != nil {
		t.Fatalf("Revoke after expiry: %v", err)
	}
}

func TestMembershipRevoke(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	m, err := c.Register(ctx, "n1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	members := c.WatchAlive(ctx)
	if ev := nextEvent(t, members, 5*time.Second); ev.Change != catalog.MemberJoined || ev.Name != "n1" {
		t.Fatalf("first event: %+v, want n1 joined (alive before the watch)", ev)
	}
	start := time.Now()
	if err := m.Revoke(ctx); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, members, time.Second)
	if ev.Change != catalog.MemberLost || ev.Name != "n1" {
		t.Fatalf("after Revoke: %+v", ev)
	}
	t.Logf("revoke reported in %v", time.Since(start).Round(time.Millisecond))
	if err := m.KeepAlive(ctx); !errors.Is(err, catalog.ErrLeaseExpired) {
		t.Fatalf("KeepAlive after Revoke = %v, want ErrLeaseExpired", err)
	}
}

func TestWatchAlive(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	a, err := c.Register(ctx, "a", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	members := c.WatchAlive(ctx)
	b, err := c.Register(ctx, "b", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Revoke(ctx); err != nil {
		t.Fatal(err)
	}
	// b registers again (a restarted agent): its key moves to the new
	// lease, so revoking the old one does not report it lost.
	b2, err := c.Register(ctx, "b", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Revoke(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b2.Revoke(ctx); err != nil {
		t.Fatal(err)
	}

	type change struct {
		Change catalog.MemberChange
		Name   string
	}
	want := []change{
		{catalog.MemberJoined, "a"},
		{catalog.MemberJoined, "b"},
		{catalog.MemberLost, "a"},
		{catalog.MemberJoined, "b"},
		{catalog.MemberLost, "b"},
	}
	var got []change
	var last int64
	for range want {
		ev := nextEvent(t, members, 5*time.Second)
		if ev.Err != nil || ev.Rev < last {
			t.Fatalf("event %+v after revision %d", ev, last)
		}
		last = ev.Rev
		got = append(got, change{ev.Change, ev.Name})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("member events (-want +got):\n%s", diff)
	}
	select {
	case ev := <-members:
		t.Fatalf("unexpected event %+v", ev)
	case <-time.After(200 * time.Millisecond):
	}
	if alive, err := c.Alive(ctx); err != nil || len(alive) != 0 {
		t.Fatalf("Alive at the end: %v, %v", alive, err)
	}
}

func TestRegisterInvalid(t *testing.T) {
	c := newCatalog(t)
	ctx := testContext(t)
	for _, tc := range []struct {
		name string
		ttl  time.Duration
	}{
		{"", time.Second},
		{"a/b", time.Second},
		{"a", 0},
	} {
		if _, err := c.Register(ctx, tc.name, tc.ttl); err == nil {
			t.Errorf("Register(%q, %v) succeeded", tc.name, tc.ttl)
		}
	}
}
