package netw

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
)

// dial connects from rank from's netns to to.
func dial(from Rank, to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := InNetns(from.Path(), func() (err error) {
		d := net.Dialer{Timeout: timeout}
		c, err = d.Dial("tcp", to.String())
		return err
	})
	return c, err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func mustLocked(t *testing.T, path string, want bool) {
	t.Helper()
	got, err := NetnsLocked(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("NetnsLocked(%s) = %v, want %v", path, got, want)
	}
}

func TestLockNetns(t *testing.T) {
	needRoot(t)
	c, prefix := testCluster(t, 2)
	gs := testAgents(t, c, prefix, 310, "10.217.10.0/24")
	for _, g := range gs {
		g.ensure(t)
	}
	ctx := context.Background()
	r1 := gs[0].attach(t, "10.217.10.11", false)
	// As for a restore: locked from the start, attached from inside node 2.
	r2 := gs[1].attach(t, "10.217.10.12", true)
	placement{r1.Addr: 0, r2.Addr: 1}.setRemotes(t, c, gs)
	serveEcho(t, r1, "r1:")
	serveEcho(t, r2, "r2:")
	to1 := netip.AddrPortFrom(r1.Addr, echoPort)
	to2 := netip.AddrPortFrom(r2.Addr, echoPort)

	mustLocked(t, r1.Path(), false)
	mustLocked(t, r2.Path(), true)
	if _, err := dial(r1, to2, 500*time.Millisecond); !isTimeout(err) {
		t.Fatalf("connect into the locked rank: %v, want a timeout", err)
	}
	if _, err := dial(r2, to1, 500*time.Millisecond); !isTimeout(err) {
		t.Fatalf("connect out of the locked rank: %v, want a timeout", err)
	}
	// Loopback works while locked: the rank's own address and 127.0.0.1.
	mustEcho(t, r2, r2.Addr, "r2:")
	var ln net.Listener
	if err := InNetns(r2.Path(), func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = io.WriteString(c, "lo")
			c.Close()
		}
	}()
	lc, err := dial(r2, netip.MustParseAddrPort(ln.Addr().String()), time.Second)
	if err != nil {
		t.Fatalf("loopback in the locked rank: %v", err)
	}
	if b, err := io.ReadAll(lc); err != nil || string(b) != "lo" {
		t.Errorf("loopback read %q, %v", b, err)
	}
	lc.Close()

	for range 2 {
		if err := UnlockNetns(ctx, r2.Path()); err != nil {
			t.Fatal(err)
		}
	}
	mustLocked(t, r2.Path(), false)
	mustEcho(t, r1, r2.Addr, "r2:")
	mustEcho(t, r2, r1.Addr, "r1:")

	t.Run("established", func(t *testing.T) {
		conn, err := dial(r1, to2, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		if b := make([]byte, 3); !readFull(t, conn, b) || string(b) != "r2:" {
			t.Fatalf("greeting %q", b)
		}
		roundTrip := func(n int) []byte {
			p := make([]byte, n)
			_, _ = rand.Read(p)
			go func() { _, _ = conn.Write(p) }()
			return p
		}
		got := make([]byte, 64<<10)
		if want := roundTrip(len(got)); !readFull(t, conn, got) || !bytes.Equal(got, want) {
			t.Fatal("echo before the lock differs")
		}

		for range 2 {
			if err := LockNetns(ctx, r2.Path()); err != nil {
				t.Fatal(err)
			}
		}
		mustLocked(t, r2.Path(), true)
		want := roundTrip(256 << 10)
		_ = conn.SetReadDeadline(time.Now().Add(700 * time.Millisecond))
		if n, err := conn.Read(make([]byte, 1)); !isTimeout(err) {
			t.Fatalf("read through the lock: %d bytes, %v; want a timeout", n, err)
		}
		start := time.Now()
		if err := UnlockNetns(ctx, r2.Path()); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		got = make([]byte, len(want))
		if !readFull(t, conn, got) || !bytes.Equal(got, want) {
			t.Fatal("data sent during the lock came back different")
		}
		t.Logf("%d KiB sent during a 700ms lock echoed back intact %v after unlock", len(want)>>10, time.Since(start).Round(time.Millisecond))
	})

	t.Run("other tables", func(t *testing.T) {
		// A table of CRIU's is neither touched nor mistaken for the lock,
		// and an empty table of the lock's name is no lock, and is rebuilt.
		criu := &nftables.Table{Family: nftables.TableFamilyINet, Name: "CRIU-4242"}
		fake := &nftables.Table{Family: nftables.TableFamilyINet, Name: lockTable}
		nft(t, r1.Path(), func(c *nftables.Conn) { c.AddTable(criu); c.AddTable(fake) })
		mustLocked(t, r1.Path(), false)
		if err := LockNetns(ctx, r1.Path()); err != nil {
			t.Fatal(err)
		}
		mustLocked(t, r1.Path(), true)
		if _, err := dial(r2, to1, 300*time.Millisecond); !isTimeout(err) {
			t.Fatalf("connect into the rebuilt lock: %v, want a timeout", err)
		}
		if err := UnlockNetns(ctx, r1.Path()); err != nil {
			t.Fatal(err)
		}
		var names []string
		nft(t, r1.Path(), func(c *nftables.Conn) {
			ts, err := c.ListTables()
			if err != nil {
				t.Error(err)
			}
			for _, t := range ts {
				names = append(names, t.Name)
			}
		})
		slices.Sort(names)
		if want := []string{criu.Name, lockTable}; !slices.Equal(names, want) {
			t.Errorf("tables after lock and unlock: %q, want %q", names, want)
		}
		mustEcho(t, r2, r1.Addr, "r1:")
	})

	t.Run("missing netns", func(t *testing.T) {
		missing := NetnsPath(prefix + "nonesuch")
		if err := LockNetns(ctx, missing); err == nil {
			t.Error("LockNetns of a missing netns succeeded")
		}
		if _, err := NetnsLocked(ctx, missing); err == nil {
			t.Error("NetnsLocked of a missing netns succeeded")
		}
	})

	const n = 100
	var lock, unlock, query time.Duration
	for range n {
		t0 := time.Now()
		if err := LockNetns(ctx, r2.Path()); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if _, err := NetnsLocked(ctx, r2.Path()); err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		if err := UnlockNetns(ctx, r2.Path()); err != nil {
			t.Fatal(err)
		}
		lock, query, unlock = lock+t1.Sub(t0), query+t2.Sub(t1), unlock+time.Since(t2)
	}
	t.Logf("mean of %d: LockNetns %v, UnlockNetns %v, NetnsLocked %v", n, lock/n, unlock/n, query/n)
	mustEcho(t, r1, r2.Addr, "r2:")
}

// nft runs fn on an nftables connection into the netns at path, and
// flushes what it queued.
func nft(t *testing.T, path string, fn func(*nftables.Conn)) {
	t.Helper()
	err := withNetfilter(context.Background(), path, "test", func(nsfd int, _ *netlink.Conn) error {
		c, err := nftables.New(nftables.WithNetNSFd(nsfd))
		if err != nil {
			return err
		}
		fn(c)
		return c.Flush()
	})
	if err != nil {
		t.Fatal(err)
	}
}

func readFull(t *testing.T, c net.Conn, b []byte) bool {
	t.Helper()
	if _, err := io.ReadFull(c, b); err != nil {
		t.Errorf("read: %v", err)
		return false
	}
	return true
}

func BenchmarkLockUnlock(b *testing.B) {
	needRoot(b)
	ns := testPrefix(b) + "bench"
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v: %s", err, out)
	}
	b.Cleanup(func() {
		if err := deleteNetns(context.Background(), ns); err != nil {
			b.Error(err)
		}
		assertGone(b, ns)
	})
	ctx := context.Background()
	for b.Loop() {
		if err := LockNetns(ctx, NetnsPath(ns)); err != nil {
			b.Fatal(err)
		}
		if err := UnlockNetns(ctx, NetnsPath(ns)); err != nil {
			b.Fatal(err)
		}
	}
}
