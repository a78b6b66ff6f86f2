package netw

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const echoPort = 7100

// needRoot skips tests that build namespaces unless run as root with the
// tools they drive.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, tool := range []string{"ip", "bridge", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
}

// testPrefix is a name prefix of its own for one test, so that tests and
// runs never touch each other's namespaces and links.
func testPrefix(t testing.TB) string {
	t.Helper()
	b := make([]byte, 2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("nwt%x", b)
}

// testCluster creates a cluster of n nodes and arranges for it, and anything
// else named with its prefix, to be removed when the test ends, checking
// that nothing is left.
func testCluster(t *testing.T, n int) (Cluster, string) {
	t.Helper()
	prefix := testPrefix(t)
	c, err := NewCluster(prefix, netip.MustParsePrefix("10.215.7.0/24"), n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Delete(ctx); err != nil {
			t.Errorf("delete cluster: %v", err)
		}
		if err := Cleanup(ctx, prefix); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		assertGone(t, prefix)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Create(ctx); err != nil {
		t.Fatal(err)
	}
	return c, prefix
}

// testJobNet creates a job network on c's nodes, deleted when the test ends.
func testJobNet(t *testing.T, c Cluster, prefix string, vni uint32, subnet string) *JobNet {
	t.Helper()
	j := NewJobNet(prefix, vni, netip.MustParsePrefix(subnet), c.Nodes)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := j.Delete(ctx); err != nil {
			t.Errorf("delete job net %d: %v", vni, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := j.Create(ctx); err != nil {
		t.Fatal(err)
	}
	return j
}

func attach(t *testing.T, j *JobNet, node, addr string) Rank {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := j.AttachRank(ctx, node, netip.MustParseAddr(addr))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func detach(t *testing.T, j *JobNet, addr netip.Addr) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := j.DetachRank(ctx, addr); err != nil {
		t.Fatal(err)
	}
}

// assertGone fails the test if a netns or host link named with prefix exists.
func assertGone(t testing.TB, prefix string) {
	t.Helper()
	for _, args := range [][]string{{"netns", "list"}, {"-o", "link", "show"}} {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			continue
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, prefix) {
				t.Errorf("left behind (ip %s): %s", strings.Join(args, " "), line)
			}
		}
	}
}

// serveEcho listens on r's address in r's netns; each connection gets tag,
// then its own bytes back. The listener closes when the test ends, or by
// the returned func.
func serveEcho(t *testing.T, r Rank, tag string) (stop func()) {
	t.Helper()
	var ln net.Listener
	err := InNetns(r.Path(), func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(r.Addr, echoPort).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(c, tag); err != nil {
					return
				}
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	stop = func() { _ = ln.Close() }
	t.Cleanup(stop)
	return stop
}

// echo connects from rank from to to's echo server, sends a payload larger
// than several MTUs, and returns what came back.
func echo(from Rank, to netip.Addr, timeout time.Duration) ([]byte, []byte, error) {
	payload := make([]byte, 64<<10)
	if _, err := rand.Read(payload); err != nil {
		return nil, nil, err
	}
	var c net.Conn
	err := InNetns(from.Path(), func() (err error) {
		d := net.Dialer{Timeout: timeout}
		c, err = d.Dial("tcp", netip.AddrPortFrom(to, echoPort).String())
		return err
	})
	if err != nil {
		return payload, nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err := errors.Join(err, <-werr); err != nil {
		return payload, got, err
	}
	return payload, got, nil
}

func mustEcho(t *testing.T, from Rank, to netip.Addr, tag string) {
	t.Helper()
	payload, got, err := echo(from, to, 5*time.Second)
	if err != nil {
		t.Fatalf("echo %s -> %s: %v", from.Addr, to, err)
	}
	want := append([]byte(tag), payload...)
	if !bytes.Equal(got, want) {
		t.Fatalf("echo %s -> %s: got %d bytes (prefix %q), want %d starting %q",
			from.Addr, to, len(got), got[:min(len(got), len(tag))], len(want), tag)
	}
}

func TestJobNetTCPAcrossNodes(t *testing.T) {
	needRoot(t)
	c, prefix := testCluster(t, 3)
	j := testJobNet(t, c, prefix, 100, "10.216.0.0/24")
	r1 := attach(t, j, c.Nodes[0].Name, "10.216.0.11")
	r2 := attach(t, j, c.Nodes[1].Name, "10.216.0.12")
	r3 := attach(t, j, c.Nodes[0].Name, "10.216.0.13") // a neighbour on r1's node

	serveEcho(t, r2, "r2:")
	serveEcho(t, r1, "r1:")
	mustEcho(t, r1, r2.Addr, "r2:")
	mustEcho(t, r2, r1.Addr, "r1:")
	mustEcho(t, r3, r1.Addr, "r1:")
	mustEcho(t, r3, r2.Addr, "r2:")

	// Nothing is flooded: node 3, which holds no rank, never got a frame
	// of the job, not even an ARP request.
	if n := vxlanRxPackets(t, c.Nodes[2], j.VXLANName()); n != 0 {
		t.Errorf("node 3's %s received %d packets; want 0 (no flooding)", j.VXLANName(), n)
	}
	if n := vxlanRxPackets(t, c.Nodes[1], j.VXLANName()); n == 0 {
		t.Errorf("node 2's %s received no packets: the counter does not count", j.VXLANName())
	}

	ctx := context.Background()
	if _, err := j.AttachRank(ctx, c.Nodes[2].Name, r2.Addr); !errors.Is(err, ErrAttached) {
		t.Errorf("attach of an attached address: got %v, want ErrAttached", err)
	}
	if out, err := r1.Command(ctx, "ip", "-o", "link", "show", "eth0").CombinedOutput(); err != nil ||
		!bytes.Contains(out, []byte(r1.MAC.String())) || !bytes.Contains(out, []byte(fmt.Sprintf("mtu %d", OverlayMTU))) {
		t.Errorf("rank eth0: %v: %s; want MAC %s, mtu %d", err, out, r1.MAC, OverlayMTU)
	}
}

// vxlanRxPackets is how many packets the vxlan device vx on node n received.
func vxlanRxPackets(t *testing.T, n Node, vx string) uint64 {
	t.Helper()
	out, err := exec.Command("ip", "-n", n.Name, "-j", "-s", "link", "show", "dev", vx).Output()
	if err != nil {
		t.Fatalf("ip -n %s -s link show %s: %v", n.Name, vx, err)
	}
	var links []struct {
		Stats64 struct {
			Rx struct {
				Packets uint64 `json:"packets"`
			} `json:"rx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		t.Fatalf("ip -j output %q: %v", out, err)
	}
	return links[0].Stats64.Rx.Packets
}

func TestJobNetMoveRank(t *testing.T) {
	needRoot(t)
	c, prefix := testCluster(t, 3)
	j := testJobNet(t, c, prefix, 101, "10.216.1.0/24")
	r1 := attach(t, j, c.Nodes[0].Name, "10.216.1.11")
	r2 := attach(t, j, c.Nodes[1].Name, "10.216.1.12")
	stop := serveEcho(t, r2, "on n2:")
	mustEcho(t, r1, r2.Addr, "on n2:")

	stop()
	detach(t, j, r2.Addr)
	if NetnsExists(r2.Netns) || linkExistsIn(context.Background(), c.Nodes[1].Name, r2.Veth) {
		t.Fatalf("rank %s still on %s after detach", r2.Addr, r2.Node)
	}
	moved := attach(t, j, c.Nodes[2].Name, r2.Addr.String())
	if on, _ := j.Locate(moved.Addr); on != c.Nodes[2].Name {
		t.Fatalf("Locate(%s) = %s, want %s", moved.Addr, on, c.Nodes[2].Name)
	}
	serveEcho(t, moved, "on n3:")
	mustEcho(t, r1, moved.Addr, "on n3:")
	serveEcho(t, r1, "r1:")
	mustEcho(t, moved, r1.Addr, "r1:")
}

func TestJobNetsIsolated(t *testing.T) {
	needRoot(t)
	c, prefix := testCluster(t, 3)
	const subnet = "10.216.2.0/24"
	a := testJobNet(t, c, prefix, 201, subnet)
	b := testJobNet(t, c, prefix, 202, subnet)
	a1 := attach(t, a, c.Nodes[0].Name, "10.216.2.11")
	a2 := attach(t, a, c.Nodes[1].Name, "10.216.2.12")
	a3 := attach(t, a, c.Nodes[2].Name, "10.216.2.13")
	b1 := attach(t, b, c.Nodes[1].Name, "10.216.2.11")
	b2 := attach(t, b, c.Nodes[0].Name, "10.216.2.12")
	serveEcho(t, a2, "job a:")
	serveEcho(t, b2, "job b:")
	serveEcho(t, a3, "job a only:")

	mustEcho(t, a1, a2.Addr, "job a:")
	mustEcho(t, b1, b2.Addr, "job b:")
	if _, _, err := echo(b1, a3.Addr, time.Second); err == nil {
		t.Errorf("job b's rank reached job a's %s", a3.Addr)
	} else {
		t.Logf("job b -> %s, which only job a has: %v", a3.Addr, err)
	}
}

func TestRankMAC(t *testing.T) {
	for _, tc := range []struct {
		addr, want string
		err        bool
	}{
		{addr: "10.216.0.11", want: "02:ca:0a:d8:00:0b"},
		{addr: "192.168.255.1", want: "02:ca:c0:a8:ff:01"},
		{addr: "fd00::1", err: true},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			mac, err := RankMAC(netip.MustParseAddr(tc.addr))
			if (err != nil) != tc.err {
				t.Fatalf("RankMAC(%s) error %v, want error %v", tc.addr, err, tc.err)
			}
			if err == nil && mac.String() != tc.want {
				t.Errorf("RankMAC(%s) = %s, want %s", tc.addr, mac, tc.want)
			}
		})
	}
}

func TestNewCluster(t *testing.T) {
	c, err := NewCluster("ab", netip.MustParsePrefix("10.215.3.0/24"), 2)
	if err != nil {
		t.Fatal(err)
	}
	br := Bridge{Name: "abbr", Subnet: netip.MustParsePrefix("10.215.3.0/24")}
	want := Cluster{Underlay: br, Nodes: []Node{
		{Name: "abn1", Addr: netip.MustParseAddr("10.215.3.2"), Underlay: br},
		{Name: "abn2", Addr: netip.MustParseAddr("10.215.3.3"), Underlay: br},
	}}
	if d := cmp.Diff(want, c, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Errorf("NewCluster (-want +got):\n%s", d)
	}
	if _, err := NewCluster("ab", netip.MustParsePrefix("10.215.3.0/30"), 2); err == nil {
		t.Error("NewCluster: 2 nodes fit in a /30")
	}
	if err := Cleanup(context.Background(), "ab"); err == nil {
		t.Error("Cleanup accepted a 2-byte prefix")
	}
}
