package netw

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// testNetns makes an empty netns for the test and returns its path.
func testNetns(t *testing.T) string {
	t.Helper()
	needRoot(t)
	name := testPrefix(t) + "-nft"
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return NetnsPath(name)
}

// ruleHandles lists the handles of the rules of table t's input chain, and
// the ports they accept, in the namespace at path.
func ruleHandles(t *testing.T, path string, tb *nftables.Table) (handles []uint64, ports []uint16) {
	t.Helper()
	err := withNftables(context.Background(), path, func(c *nftables.Conn) error {
		rules, err := c.GetRules(tb, &nftables.Chain{Name: "input", Table: tb})
		for _, r := range rules {
			handles = append(handles, r.Handle)
			for _, e := range r.Exprs {
				if cmp, ok := e.(*expr.Cmp); ok && len(cmp.Data) == 2 {
					ports = append(ports, uint16(cmp.Data[0])<<8|uint16(cmp.Data[1]))
				}
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return handles, ports
}

// rulesetGen is the generation of the nftables ruleset in the namespace at
// path, which every transaction that changes it raises.
func rulesetGen(t *testing.T, path string) uint32 {
	t.Helper()
	var gen uint32
	err := withNetfilter(context.Background(), path, "generation of", func(_ int, nl *netlink.Conn) error {
		msgs, err := nl.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
			Data:   nfgenmsg(unix.AF_UNSPEC, 0),
		})
		if err != nil {
			return err
		}
		if len(msgs) != 1 || len(msgs[0].Data) < 4 {
			return fmt.Errorf("%d replies", len(msgs))
		}
		ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
		if err != nil {
			return err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				gen = ad.Uint32()
			}
		}
		return ad.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return gen
}

// TestGuardsKept: a bridge's guard and a job's VXLAN filter set again as
// they are are left as they are (no transaction that deletes, which waits
// for an RCU grace period); set otherwise they change: other ports replace
// the guard, other peers change only the filter's set. A table of the
// same name that cairn did not make so is replaced whole.
func TestGuardsKept(t *testing.T) {
	ctx := context.Background()
	path := testNetns(t)
	guard := &nftables.Table{Family: nftables.TableFamilyINet, Name: GuardTable("brz")}

	if err := Guard(ctx, path, "brz", nil); err != nil {
		t.Fatal(err)
	}
	gen := rulesetGen(t, path)
	if err := Guard(ctx, path, "brz", nil); err != nil {
		t.Fatal(err)
	}
	if h, _ := ruleHandles(t, path, guard); len(h) != 2 || rulesetGen(t, path) != gen {
		t.Errorf("guard set again: %d rules, ruleset generation %d after %d; want 2, unchanged", len(h), rulesetGen(t, path), gen)
	}
	if err := Guard(ctx, path, "brz", []uint16{8080}); err != nil {
		t.Fatal(err)
	}
	if h, ports := ruleHandles(t, path, guard); len(h) != 3 || !slices.Contains(ports, 8080) {
		t.Errorf("guard with port 8080: rules %v accepting %v, want 3 with 8080", h, ports)
	}

	// A table of that name, not made by Guard: replaced.
	if err := Unguard(ctx, path, "brz"); err != nil {
		t.Fatal(err)
	}
	err := withNftables(ctx, path, func(c *nftables.Conn) error {
		c.AddTable(guard)
		accept := nftables.ChainPolicyAccept
		c.AddChain(&nftables.Chain{Name: "input", Table: guard, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
		return c.Flush()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := Guard(ctx, path, "brz", nil); err != nil {
		t.Fatal(err)
	}
	if h, _ := ruleHandles(t, path, guard); len(h) != 2 {
		t.Errorf("guard over a table of its name: %d rules, want 2", len(h))
	}

	// The VXLAN filter: its rule stays, its set follows the peers.
	a, b := netip.MustParseAddr("10.215.7.2"), netip.MustParseAddr("10.215.7.3")
	filter := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: VXLANGuardTable(5)}
	// Each step: the peers, and the transactions it takes (the table's
	// rule added once, then only the set changes, in one transaction).
	for i, step := range []struct {
		peers []netip.Addr
		txns  uint32
	}{{[]netip.Addr{a}, 1}, {[]netip.Addr{a, b}, 1}, {[]netip.Addr{b}, 1}, {[]netip.Addr{b}, 0}, {nil, 1}} {
		gen := rulesetGen(t, path)
		if err := guardVXLAN(ctx, path, 5, 4789, step.peers); err != nil {
			t.Fatal(err)
		}
		got, ok, err := vxlanPeers(ctx, path, 5)
		if err != nil || !ok || !slices.Equal(got, step.peers) {
			t.Errorf("step %d: peers %v (%v, %v), want %v", i, got, ok, err, step.peers)
		}
		if h, ports := ruleHandles(t, path, filter); len(h) != 1 || !slices.Contains(ports, 4789) {
			t.Errorf("step %d: rules %v for ports %v, want one for 4789", i, h, ports)
		}
		if n := rulesetGen(t, path) - gen; n != step.txns {
			t.Errorf("step %d: %d transactions, want %d", i, n, step.txns)
		}
	}
	if err := guardVXLAN(ctx, path, 5, 4790, []netip.Addr{a}); err != nil {
		t.Fatal(err)
	}
	if h, ports := ruleHandles(t, path, filter); len(h) != 1 || !slices.Contains(ports, 4790) || slices.Contains(ports, 4789) {
		t.Errorf("filter for another port: rules %v for ports %v, want one for 4790", h, ports)
	}
}
