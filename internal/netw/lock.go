package netw

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// lockTable is the nftables table that locks a network namespace. CRIU
// names its own tables CRIU-<pid>, so the two never meet.
const lockTable = "cairn_lock"

// lockChains is how many chains lockTable has: input and output.
const lockChains = 2

// lockPriority runs the lock's chains before every other netfilter hook
// (defrag at -400, raw at -300, conntrack at -200, CRIU's tables at 0), so
// that a dropped packet leaves no trace anywhere, not even in conntrack.
const lockPriority nftables.ChainPriority = -500

// LockNetns makes the network namespace at path drop every packet it would
// receive or send, except on lo. A global checkpoint locks a rank's network
// from before its dump until every rank is dumped, and a restored rank's
// from before its restore until every rank is restored: peers then see a
// silent link, not resets, and TCP retransmits what was dropped once the
// lock is lifted. Loopback stays open because it is the rank's own
// business.
//
// Only IPv4 and IPv6 are dropped; ARP is not, so that peers' neighbour
// entries stay valid. Locking a locked namespace is not an error.
//
// The lock is an nftables table whose input and output chains drop all but
// lo. The first lock creates it; after that, unlock and lock only toggle its
// dormant flag, which unhooks and rehooks the chains. Each is a query and
// one atomic netlink transaction, well under a millisecond together, where
// deleting the table at unlock would cost 10-15 ms: nf_tables deletions
// wait for the kernel's RCU grace period. So an unlocked namespace that was
// ever locked keeps a dormant cairn_lock table, which filters nothing. It
// goes with the namespace, and CRIU never dumps it: runc joins rank
// namespaces by path, so CRIU treats them as external.
func LockNetns(ctx context.Context, path string) error {
	return withNetfilter(ctx, path, "lock", func(nsfd int, nl *netlink.Conn) error {
		for range 2 {
			t, err := getLockTable(nl)
			switch {
			case err != nil:
				return err
			case t.exists && t.use != lockChains:
				// Not as LockNetns made it: make it anew, slowly.
				return buildLock(ctx, nsfd, true)
			case t.exists && t.flags&unix.NFT_TABLE_F_DORMANT == 0:
				return nil
			case t.exists:
				return setLockFlags(nl, t.flags&^unix.NFT_TABLE_F_DORMANT)
			}
			// Lost a race with another locker: its table will do.
			if err := buildLock(ctx, nsfd, false); !errors.Is(err, unix.EEXIST) {
				return err
			}
		}
		return fmt.Errorf("table %s keeps appearing and vanishing", lockTable)
	})
}

// UnlockNetns lifts LockNetns's lock. Unlocking a namespace that is not
// locked is not an error.
func UnlockNetns(ctx context.Context, path string) error {
	return withNetfilter(ctx, path, "unlock", func(_ int, nl *netlink.Conn) error {
		t, err := getLockTable(nl)
		if err != nil || !t.exists || t.flags&unix.NFT_TABLE_F_DORMANT != 0 {
			return err
		}
		return setLockFlags(nl, t.flags|unix.NFT_TABLE_F_DORMANT)
	})
}

// NetnsLocked reports whether the network namespace at path is locked.
func NetnsLocked(ctx context.Context, path string) (bool, error) {
	var locked bool
	err := withNetfilter(ctx, path, "query lock of", func(_ int, nl *netlink.Conn) error {
		t, err := getLockTable(nl)
		locked = t.exists && t.use == lockChains && t.flags&unix.NFT_TABLE_F_DORMANT == 0
		return err
	})
	return locked, err
}

// withNetfilter runs fn with a netfilter netlink socket in the network
// namespace at path, and the namespace's fd for more. The socket obeys
// ctx's deadline.
//
// Flags are read and set over this socket rather than with
// github.com/google/nftables, which (v0.3.0) always sends a table's flags
// as 0 and decodes them in host byte order; that package builds the table.
func withNetfilter(ctx context.Context, path, what string, fn func(nsfd int, nl *netlink.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s netns %s: %w", what, path, err)
	}
	defer f.Close()
	nsfd := int(f.Fd())
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsfd})
	if err == nil {
		defer nl.Close()
		if d, ok := ctx.Deadline(); ok {
			err = nl.SetDeadline(d)
		}
	}
	if err == nil {
		err = fn(nsfd, nl)
	}
	if err != nil {
		return fmt.Errorf("%s netns %s: %w", what, path, err)
	}
	return nil
}

// nfgenmsg is the header of every nfnetlink message.
func nfgenmsg(family uint8, resID uint16) []byte {
	return binary.BigEndian.AppendUint16([]byte{family, unix.NFNETLINK_V0}, resID)
}

type lockTableState struct {
	exists bool
	flags  uint32
	use    uint32 // chains in the table
}

func getLockTable(nl *netlink.Conn) (lockTableState, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_TABLE_NAME, lockTable)
	attrs, err := ae.Encode()
	if err != nil {
		return lockTableState{}, err
	}
	msgs, err := nl.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETTABLE),
			Flags: netlink.Request,
		},
		Data: append(nfgenmsg(unix.NFPROTO_INET, 0), attrs...),
	})
	if errors.Is(err, unix.ENOENT) {
		return lockTableState{}, nil
	}
	if err != nil {
		return lockTableState{}, fmt.Errorf("get table %s: %w", lockTable, err)
	}
	if len(msgs) != 1 || len(msgs[0].Data) < 4 {
		return lockTableState{}, fmt.Errorf("get table %s: %d replies", lockTable, len(msgs))
	}
	ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
	if err != nil {
		return lockTableState{}, err
	}
	ad.ByteOrder = binary.BigEndian
	t := lockTableState{exists: true}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_TABLE_FLAGS:
			t.flags = ad.Uint32()
		case unix.NFTA_TABLE_USE:
			t.use = ad.Uint32()
		}
	}
	return t, ad.Err()
}

// setLockFlags changes lockTable's flags in a one-message transaction.
func setLockFlags(nl *netlink.Conn, flags uint32) error {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.String(unix.NFTA_TABLE_NAME, lockTable)
	ae.Uint32(unix.NFTA_TABLE_FLAGS, flags)
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	batch := nfgenmsg(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	if _, err := nl.SendMessages([]netlink.Message{
		{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_BEGIN, Flags: netlink.Request}, Data: batch},
		{
			Header: netlink.Header{
				Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE),
				Flags: netlink.Request | netlink.Acknowledge,
			},
			Data: append(nfgenmsg(unix.NFPROTO_INET, 0), attrs...),
		},
		{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_END, Flags: netlink.Request}, Data: batch},
	}); err != nil {
		return fmt.Errorf("set table %s flags %#x: %w", lockTable, flags, err)
	}
	// Only the table message asks for an acknowledgement.
	if _, err := nl.Receive(); err != nil {
		return fmt.Errorf("set table %s flags %#x: %w", lockTable, flags, err)
	}
	return nil
}

// buildLock creates lockTable, awake, in one transaction: with replace, in
// place of an existing one; without, failing with EEXIST if there is one.
func buildLock(ctx context.Context, nsfd int, replace bool) error {
	opts := []nftables.ConnOption{nftables.WithNetNSFd(nsfd)}
	if d, ok := ctx.Deadline(); ok {
		opts = append(opts, nftables.WithSockOptions(func(c *netlink.Conn) error { return c.SetDeadline(d) }))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: lockTable}
	if replace {
		// Add first, so that the delete cannot fail.
		c.AddTable(t)
		c.DelTable(t)
	}
	c.CreateTable(t)
	drop, prio := nftables.ChainPolicyDrop, lockPriority
	for _, h := range []struct {
		name string
		hook *nftables.ChainHook
		dev  expr.MetaKey
	}{
		{"input", nftables.ChainHookInput, expr.MetaKeyIIFNAME},
		{"output", nftables.ChainHookOutput, expr.MetaKeyOIFNAME},
	} {
		ch := c.AddChain(&nftables.Chain{
			Name: h.name, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: h.hook, Priority: &prio, Policy: &drop,
		})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: h.dev, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("create table %s: %w", lockTable, err)
	}
	return nil
}

// ifname is name as nftables compares interface names: NUL-padded to
// IFNAMSIZ.
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// DropCRIULock removes CRIU's network-lock tables (named CRIU or
// CRIU-<pid>) from the network namespace at path: a CRIU killed mid-dump
// never removes them, and they drop the namespace's TCP traffic for good.
func DropCRIULock(ctx context.Context, path string) error {
	return withNftables(ctx, path, func(c *nftables.Conn) error {
		tables, err := c.ListTables()
		if err != nil {
			return fmt.Errorf("list tables of netns %s: %w", path, err)
		}
		n := 0
		for _, t := range tables {
			if t.Name == "CRIU" || strings.HasPrefix(t.Name, "CRIU-") {
				c.DelTable(t)
				n++
			}
		}
		if n == 0 {
			return nil
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("drop CRIU's lock in netns %s: %w", path, err)
		}
		return nil
	})
}
