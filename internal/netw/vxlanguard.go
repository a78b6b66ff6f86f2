package netw

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A job network's VXLAN port is open to the underlay: any host that reaches
// it could send a datagram with the job's VNI and have its inner frame
// delivered to a rank as if another rank had sent it. The node therefore
// takes the job's VXLAN only from the nodes it sends the job's traffic to:
// an nftables table per job, cairn_vxlan_VNI, whose input chain drops a UDP
// datagram to the VXLAN port carrying the job's VNI unless its source
// address is in the table's set of peers. The set is exactly the underlay
// destinations of the vxlan device's forwarding entries, so it follows
// every SetRemotes, AttachRank and DetachRank: the nodes that run the job's
// other ranks, and no other host.
//
// This stops hosts that are not nodes of the job. It cannot stop a host
// that sends with a node's address (a spoofed source, or a local user on a
// node of the job); on an underlay others share, the nodes need an
// authenticated tunnel between them (WireGuard or IPsec) for that.

// vxlanGuardPrefix starts the name of the table that filters one job's
// VXLAN: cairn_vxlan_VNI.
const vxlanGuardPrefix = "cairn_vxlan_"

// VXLANGuardTable is the name of the table that filters job vni's VXLAN.
func VXLANGuardTable(vni uint32) string { return fmt.Sprintf("%s%d", vxlanGuardPrefix, vni) }

// vxlanPeersSet names the set of underlay addresses a job's VXLAN is taken
// from.
const vxlanPeersSet = "peers"

// guardVXLAN sets the job's VXLAN filter in the namespace at netnsPath
// ("" for this process's): datagrams to port with VNI vni are dropped
// unless they come from one of peers. The first time (or over a table this
// code would not make: its rule's comment names the VNI and port) the
// table is made whole, in one transaction; after, only its set of peers
// changes, in one transaction. Peers added cost nothing; peers removed, an
// RCU grace period (nftables waits for one in any transaction that
// deletes, 7-15 ms here), which replacing the table cost every time.
func guardVXLAN(ctx context.Context, netnsPath string, vni uint32, port uint16, peers []netip.Addr) error {
	tag := fmt.Sprintf("cairn vxlan guard v1 vni %d port %d", vni, port)
	return withNftables(ctx, netnsPath, func(c *nftables.Conn) error {
		t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: VXLANGuardTable(vni)}
		exists, tagged, err := tableTagged(c, t, tag)
		switch {
		case err != nil:
			return fmt.Errorf("guard VXLAN %d: %w", vni, err)
		case tagged:
			if err := setPeers(c, t, peers); err != nil {
				return fmt.Errorf("guard VXLAN %d: %w", vni, err)
			}
			return nil
		case exists:
			c.AddTable(t) // so that the delete cannot fail
			c.DelTable(t)
		}
		c.AddTable(t)
		set := &nftables.Set{Table: t, Name: vxlanPeersSet, KeyType: nftables.TypeIPAddr}
		if err := c.AddSet(set, peerElements(peers)); err != nil {
			return fmt.Errorf("guard VXLAN %d: %w", vni, err)
		}
		accept, prio := nftables.ChainPolicyAccept, nftables.ChainPriorityFilter
		ch := c.AddChain(&nftables.Chain{
			Name: "input", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: prio, Policy: &accept,
		})
		// The VNI is bytes 4-6 of the VXLAN header, after UDP's 8.
		v := binaryutil.BigEndian.PutUint32(vni)[1:]
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: comment(tag), Exprs: []expr.Any{
			// meta l4proto udp udp dport PORT
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
			// @th,96,24 VNI
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 12, Len: 3},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: v},
			// ip saddr != @peers drop
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
		if err := c.Flush(); err != nil {
			return fmt.Errorf("guard VXLAN %d: %w", vni, err)
		}
		return nil
	})
}

// setPeers makes the peers set of table t hold exactly peers, in one
// transaction; nothing if it does.
func setPeers(c *nftables.Conn, t *nftables.Table, peers []netip.Addr) error {
	set, have, err := peersOf(c, t)
	if err != nil {
		return err
	}
	var add, del []netip.Addr
	for _, p := range peers {
		if !slices.Contains(have, p) {
			add = append(add, p)
		}
	}
	for _, h := range have {
		if !slices.Contains(peers, h) {
			del = append(del, h)
		}
	}
	if len(add) > 0 {
		if err := c.SetAddElements(set, peerElements(add)); err != nil {
			return err
		}
	}
	if len(del) > 0 {
		if err := c.SetDeleteElements(set, peerElements(del)); err != nil {
			return err
		}
	}
	if len(add)+len(del) == 0 {
		return nil
	}
	return c.Flush()
}

// peersOf returns the peers set of table t and the addresses in it.
func peersOf(c *nftables.Conn, t *nftables.Table) (*nftables.Set, []netip.Addr, error) {
	set, err := c.GetSetByName(t, vxlanPeersSet)
	if err != nil {
		return nil, nil, err
	}
	elems, err := c.GetSetElements(set)
	if err != nil {
		return nil, nil, err
	}
	var peers []netip.Addr
	for _, e := range elems {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			peers = append(peers, a)
		}
	}
	return set, peers, nil
}

// peerElements are the set elements of the IPv4 addresses peers.
func peerElements(peers []netip.Addr) []nftables.SetElement {
	var elems []nftables.SetElement
	for _, p := range peers {
		b := p.As4()
		elems = append(elems, nftables.SetElement{Key: b[:]})
	}
	return elems
}

// unguardVXLAN removes guardVXLAN's table. A missing table is not an error.
func unguardVXLAN(ctx context.Context, netnsPath string, vni uint32) error {
	if err := dropTable(ctx, netnsPath, nftables.TableFamilyIPv4, VXLANGuardTable(vni)); err != nil {
		return fmt.Errorf("unguard VXLAN %d: %w", vni, err)
	}
	return nil
}

// vxlanPeers reads the addresses the job's VXLAN is taken from in the
// namespace at netnsPath; ok is false when the job has no filter there.
func vxlanPeers(ctx context.Context, netnsPath string, vni uint32) (peers []netip.Addr, ok bool, err error) {
	err = withNftables(ctx, netnsPath, func(c *nftables.Conn) error {
		t, err := c.ListTableOfFamily(VXLANGuardTable(vni), nftables.TableFamilyIPv4)
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, os.ErrNotExist):
			return nil
		case err != nil:
			return err
		}
		_, peers, err = peersOf(c, t)
		if err != nil {
			return err
		}
		ok = true
		slices.SortFunc(peers, netip.Addr.Compare)
		return nil
	})
	return peers, ok, err
}
