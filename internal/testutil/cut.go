package testutil

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// cutClassID marks the sockets of a coordinator cut off from its etcd
// peers (net_cls classid).
const cutClassID = 0x00ca1f01

// CutFromPeers cuts the coordinator named name off from the other
// coordinators' etcd members, as a network partition would, while it
// still reaches the agents and the agents it: its process goes into a
// net_cls cgroup of its own, which marks all of its sockets (those it
// has already opened too), and an nftables table drops every TCP packet
// of its sockets to or from an etcd peer port. heal undoes it all; the
// test's cleanup heals if the test has not.
func (c *Cluster) CutFromPeers(name string) (heal func()) {
	c.t.Helper()
	co, _ := c.coord(name)
	var ports []uint16
	for _, p := range c.File().Coordinators {
		u, err := url.Parse(p.Peer)
		if err != nil || u.Port() == "" {
			c.t.Fatalf("coordinator %s has no etcd peer URL (%q): a cluster of several coordinators has", p.Name, p.Peer)
		}
		n, _ := strconv.Atoi(u.Port())
		ports = append(ports, uint16(n))
	}
	// The net_cls hierarchy is mounted only in a mount namespace of its
	// own, which nothing else sees (a mount under the host's /tmp would
	// reach containers being checkpointed meanwhile); the cgroup lives on
	// without it.
	group := "cut-" + name + "-" + strconv.Itoa(os.Getpid())
	cgroups := func(script string) error {
		out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-euc",
			`d=$(mktemp -d); mount -t cgroup -o net_cls cairn-test "$d"; cd "$d"; `+script+`; cd /; umount "$d"; rmdir "$d"`).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: "cairn_test_cut_" + strconv.Itoa(co.PID)}
	healed := false
	heal = func() {
		if healed {
			return
		}
		healed = true
		if nc, err := nftables.New(); err == nil {
			nc.AddTable(table)
			nc.DelTable(table)
			if err := nc.Flush(); err != nil {
				c.t.Errorf("remove nftables table %s: %v", table.Name, err)
			}
			nc.CloseLasting()
		}
		// Back to the root group, whose classid is none.
		if err := cgroups(fmt.Sprintf(`if [ -d %[1]s ]; then echo %[2]d > cgroup.procs 2>/dev/null || true; rmdir %[1]s; fi`, group, co.PID)); err != nil {
			c.t.Errorf("remove net_cls cgroup %s: %v", group, err)
		}
	}
	c.t.Cleanup(heal)
	// Moving the process marks every socket it holds, and every one it
	// opens from now on.
	if err := cgroups(fmt.Sprintf(`mkdir %[1]s; echo %[2]d > %[1]s/net_cls.classid; echo %[3]d > %[1]s/cgroup.procs`, group, cutClassID, co.PID)); err != nil {
		c.t.Fatalf("move coordinator %s (pid %d) into a net_cls cgroup: %v", name, co.PID, err)
	}
	nc, err := nftables.New()
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.CloseLasting()
	nc.AddTable(table)
	accept := nftables.ChainPolicyAccept
	ch := nc.AddChain(&nftables.Chain{Name: "output", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	for _, p := range ports {
		for _, off := range []uint32{0, 2} { // tcp sport, tcp dport
			nc.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyCGROUP, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(cutClassID)},
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
				&expr.Verdict{Kind: expr.VerdictDrop},
			}})
		}
	}
	if err := nc.Flush(); err != nil {
		c.t.Fatalf("nftables table %s: %v", table.Name, err)
	}
	return heal
}
