package netw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// guardPrefix starts the name of the nftables table that guards one bridge:
// cairn_guard_BRIDGE.
const guardPrefix = "cairn_guard_"

// GuardTable is the name of the table that guards bridge.
func GuardTable(bridge string) string { return guardPrefix + bridge }

// Guard makes the network namespace at netnsPath ("" for this process's)
// refuse every packet that arrives on bridge for the namespace itself,
// except replies to connections the namespace opened and new TCP
// connections to allowPorts. Containers attached to the bridge then cannot
// reach any listener of their host (the agent, the coordinator, etcd, sshd)
// on any of its addresses, while traffic the host forwards (if it routes
// a single container's bridge outside; nothing for job bridges) and
// traffic between containers are untouched: it never passes the input
// hook.
//
// The guard is an inet table (IPv4 and IPv6) with one input chain at filter
// priority; it is replaced whole, in one transaction, so calling Guard again
// with other ports is atomic. Called again with the same ports, it finds
// its table as it would make it (tagged, tableTagged) and leaves it: a
// transaction that deletes anything waits for an RCU grace period, 7-15 ms
// here, and every rank a node starts ensures its job's network. It lives
// until Unguard or until the namespace goes. Callers do not guard one
// bridge concurrently.
func Guard(ctx context.Context, netnsPath, bridge string, allowPorts []uint16) error {
	tag := fmt.Sprintf("cairn guard v1 %s ports %v", bridge, allowPorts)
	return withNftables(ctx, netnsPath, func(c *nftables.Conn) error {
		t := &nftables.Table{Family: nftables.TableFamilyINet, Name: GuardTable(bridge)}
		exists, tagged, err := tableTagged(c, t, tag)
		switch {
		case err != nil:
			return fmt.Errorf("guard bridge %s: %w", bridge, err)
		case tagged:
			return nil
		case exists:
			c.AddTable(t) // so that the delete cannot fail
			c.DelTable(t)
		}
		c.AddTable(t)
		accept, prio := nftables.ChainPolicyAccept, nftables.ChainPriorityFilter
		ch := c.AddChain(&nftables.Chain{
			Name: "input", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: prio, Policy: &accept,
		})
		onBridge := []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
		}
		rule := func(tail ...expr.Any) {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(append([]expr.Any{}, onBridge...), tail...)})
		}
		zero := binaryutil.NativeEndian.PutUint32(0)
		rule( // ct state established,related accept
			&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: zero},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: zero},
			&expr.Verdict{Kind: expr.VerdictAccept},
		)
		for _, p := range allowPorts {
			rule( // meta l4proto tcp tcp dport P accept
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
				&expr.Verdict{Kind: expr.VerdictAccept},
			)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: comment(tag),
			Exprs: append(append([]expr.Any{}, onBridge...), &expr.Verdict{Kind: expr.VerdictDrop})})
		if err := c.Flush(); err != nil {
			return fmt.Errorf("guard bridge %s: %w", bridge, err)
		}
		return nil
	})
}

// Unguard removes Guard's table. A missing table is not an error.
func Unguard(ctx context.Context, netnsPath, bridge string) error {
	if err := dropTable(ctx, netnsPath, nftables.TableFamilyINet, GuardTable(bridge)); err != nil {
		return fmt.Errorf("unguard bridge %s: %w", bridge, err)
	}
	return nil
}

// dropTable deletes an nftables table in the namespace at netnsPath ("" for
// this process's). A missing table is not an error.
func dropTable(ctx context.Context, netnsPath string, family nftables.TableFamily, name string) error {
	return withNftables(ctx, netnsPath, func(c *nftables.Conn) error {
		t := &nftables.Table{Family: family, Name: name}
		c.AddTable(t) // so that the delete cannot fail
		c.DelTable(t)
		return c.Flush()
	})
}

// Guarded reports whether bridge has Guard's table in the namespace at
// netnsPath ("" for this process's).
func Guarded(ctx context.Context, netnsPath, bridge string) (bool, error) {
	var found bool
	err := withNftables(ctx, netnsPath, func(c *nftables.Conn) error {
		_, err := c.ListTableOfFamily(GuardTable(bridge), nftables.TableFamilyINet)
		switch {
		case err == nil:
			found = true
		case errors.Is(err, unix.ENOENT), errors.Is(err, os.ErrNotExist):
		default:
			return err
		}
		return nil
	})
	return found, err
}

// tableTagged reports whether table t is in c's namespace, and whether a
// rule of its input chain carries tag as its comment: the table is what
// the code that tags it makes for the arguments the tag names.
func tableTagged(c *nftables.Conn, t *nftables.Table, tag string) (exists, tagged bool, err error) {
	_, err = c.ListTableOfFamily(t.Name, t.Family)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, os.ErrNotExist):
		return false, false, nil
	case err != nil:
		return false, false, err
	}
	rules, err := c.GetRules(t, &nftables.Chain{Name: "input", Table: t})
	if err != nil {
		return true, false, nil // no such chain: not ours as it should be
	}
	want := comment(tag)
	for _, r := range rules {
		if bytes.Equal(r.UserData, want) {
			return true, true, nil
		}
	}
	return true, false, nil
}

// comment is a rule's user data holding text as its comment, as nft
// writes one (type 0, NFTNL_UDATA_RULE_COMMENT; NUL-terminated), so that
// nft list ruleset shows it.
func comment(text string) []byte {
	v := append([]byte(text), 0)
	return append([]byte{0, byte(len(v))}, v...)
}

// withNftables runs fn with an nftables connection in the namespace at
// netnsPath ("" for this process's), obeying ctx's deadline.
func withNftables(ctx context.Context, netnsPath string, fn func(*nftables.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var opts []nftables.ConnOption
	if netnsPath != "" {
		f, err := os.Open(netnsPath)
		if err != nil {
			return err
		}
		defer f.Close()
		opts = append(opts, nftables.WithNetNSFd(int(f.Fd())))
	}
	if d, ok := ctx.Deadline(); ok {
		opts = append(opts, nftables.WithSockOptions(func(c *netlink.Conn) error { return c.SetDeadline(d) }))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	return fn(c)
}

// netnsPathOf is the bind mount of the named netns, or "" for none.
func netnsPathOf(name string) string {
	if name == "" {
		return ""
	}
	return filepath.Join(NetnsDir, name)
}

// HostPorts checks the TCP ports of the host that containers may connect
// to, as --allow-host-port gives them (flags) and as
// $CAIRN_ALLOW_HOST_PORTS does (env: comma-separated).
func HostPorts(flags []uint, env string) ([]uint16, error) {
	ports := slices.Clone(flags)
	if env != "" {
		for _, s := range strings.Split(env, ",") {
			p, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
			if err != nil {
				return nil, fmt.Errorf("$CAIRN_ALLOW_HOST_PORTS: %q is not a port", s)
			}
			ports = append(ports, uint(p))
		}
	}
	var out []uint16
	for _, p := range ports {
		if p == 0 || p > 65535 {
			return nil, fmt.Errorf("--allow-host-port %d: not a TCP port", p)
		}
		out = append(out, uint16(p))
	}
	return out, nil
}
