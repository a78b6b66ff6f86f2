package netw

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// vxlanDatagram is a VXLAN datagram for job vni carrying an Ethernet frame
// from MAC and address from to MAC and address to: an IPv4 UDP packet to
// port with payload. It is what a host on the underlay sends, without any
// privilege, to inject a frame into a job's network.
func vxlanDatagram(vni uint32, from, to netip.Addr, port uint16, payload []byte) []byte {
	srcMAC, _ := RankMAC(from)
	dstMAC, _ := RankMAC(to)
	udp := binary.BigEndian.AppendUint16(nil, 40000)
	udp = binary.BigEndian.AppendUint16(udp, port)
	udp = binary.BigEndian.AppendUint16(udp, uint16(8+len(payload)))
	udp = append(binary.BigEndian.AppendUint16(udp, 0), payload...) // no checksum
	ipv4 := []byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0}
	binary.BigEndian.PutUint16(ipv4[2:], uint16(20+len(udp)))
	f, t := from.As4(), to.As4()
	ipv4 = append(append(ipv4, f[:]...), t[:]...)
	var sum uint32
	for i := 0; i < len(ipv4); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ipv4[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(ipv4[10:], ^uint16(sum))
	eth := append(append(append([]byte{}, dstMAC...), srcMAC...), 0x08, 0x00)
	hdr := []byte{0x08, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
	return slices.Concat(hdr, eth, ipv4, udp)
}

// TestVXLANFromNodesOnly: a job's VXLAN is taken from the nodes that run
// its other ranks and from no other host on the underlay. The same crafted
// datagram that a node of the job gets delivered (so the frame itself is
// right) never reaches the rank when a host that is not one of the job's
// nodes sends it.
func TestVXLANFromNodesOnly(t *testing.T) {
	needRoot(t)
	c, prefix := testCluster(t, 3)
	const vni = 310
	gs := testAgents(t, c, prefix, vni, "10.217.10.0/24")[:2] // node 3 is not in the job
	outsider := c.Nodes[2]
	for _, g := range gs {
		g.ensure(t)
	}
	r1 := gs[0].attach(t, "10.217.10.11", false)
	r2 := gs[1].attach(t, "10.217.10.12", false)
	if err := gs[0].setRemotes(map[netip.Addr]netip.Addr{r2.Addr: c.Nodes[1].Addr}); err != nil {
		t.Fatal(err)
	}
	if err := gs[1].setRemotes(map[netip.Addr]netip.Addr{r1.Addr: c.Nodes[0].Addr}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if peers, ok, err := vxlanPeers(ctx, c.Nodes[0].Path(), vni); err != nil || !ok || !slices.Equal(peers, []netip.Addr{c.Nodes[1].Addr}) {
		t.Fatalf("node 1 takes job %d's VXLAN from %v (filter %v, %v); want %s only", vni, peers, ok, err, c.Nodes[1].Addr)
	}

	// Rank 1 listens; datagrams "from rank 2" are sent to node 1's VXLAN port.
	const port = 9310
	var ln net.PacketConn
	if err := InNetns(r1.Path(), func() (err error) {
		ln, err = net.ListenPacket("udp4", netip.AddrPortFrom(r1.Addr, port).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	send := func(from Node, payload string) {
		t.Helper()
		err := InNetns(from.Path(), func() error {
			conn, err := net.Dial("udp4", netip.AddrPortFrom(c.Nodes[0].Addr, DefaultVXLANPort).String())
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Write(vxlanDatagram(vni, r2.Addr, r1.Addr, port, []byte(payload)))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	received := func(wait time.Duration) []string {
		var got []string
		buf := make([]byte, 1500)
		for {
			_ = ln.SetReadDeadline(time.Now().Add(wait))
			n, _, err := ln.ReadFrom(buf)
			if err != nil {
				return got
			}
			got = append(got, string(buf[:n]))
		}
	}

	// From the outsider first: were it let through, it would be read
	// before the node's datagram.
	for range 3 {
		send(outsider, "spoofed")
	}
	send(c.Nodes[1], "from node 2")
	if got := received(2 * time.Second); !slices.Equal(got, []string{"from node 2"}) {
		t.Fatalf("rank 1 received %q; want only the datagram of node 2", got)
	}

	// Rank 2 moves to the outsider's node: the job's nodes are now 1 and
	// 3, and node 2 is the stranger.
	gs[1].detach(t, r2.Addr)
	g3 := agent{n: NodeJobNet{Netns: outsider.Name, Local: outsider.Addr, VNI: vni,
		Subnet: gs[0].n.Subnet, Prefix: prefix + "n3-"}}
	t.Cleanup(func() { _ = g3.do(g3.n.Delete) })
	g3.ensure(t)
	moved := g3.attach(t, r2.Addr.String(), false)
	if err := gs[0].setRemotes(map[netip.Addr]netip.Addr{moved.Addr: outsider.Addr}); err != nil {
		t.Fatal(err)
	}
	send(c.Nodes[1], "from the old node")
	send(outsider, "from the new node")
	if got := received(2 * time.Second); !slices.Equal(got, []string{"from the new node"}) {
		t.Fatalf("after the move rank 1 received %q; want only the datagram of node 3", got)
	}

	// The filter goes with the job.
	if err := gs[0].do(gs[0].n.Delete); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := vxlanPeers(ctx, c.Nodes[0].Path(), vni); ok || err != nil {
		t.Errorf("job %d's VXLAN filter left on node 1 after Delete (%v)", vni, err)
	}
}
