package netw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// NetnsDir is where iproute2 bind-mounts named network namespaces.
const NetnsDir = "/run/netns"

// ip runs `ip args...` and returns a descriptive error with ip's output.
func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// LinkExists reports whether a link with this name exists in the current
// network namespace. It asks the kernel over netlink (ip), not /sys: sysfs
// shows the links of the namespace it was mounted in, which is not this
// process's when cairn runs inside a node's namespace (nsenter --net).
func LinkExists(name string) bool {
	return exec.Command("ip", "-o", "link", "show", "dev", name).Run() == nil
}

// Bridge describes a node bridge and its subnet.
type Bridge struct {
	Name   string       // link name, at most 15 bytes
	Subnet netip.Prefix // e.g. 10.213.0.0/24; the bridge takes the first host address
	// HostPorts are the TCP ports of the host that containers on the bridge
	// may connect to; every other connection to the host is refused (Guard).
	HostPorts []uint16
}

// Gateway is the bridge's own address: the subnet's first host address.
func (b Bridge) Gateway() netip.Addr { return b.Subnet.Masked().Addr().Next() }

// Ensure creates the bridge with its gateway address if it does not exist
// and brings it up. It is idempotent.
func (b Bridge) Ensure(ctx context.Context) error {
	if len(b.Name) > 15 {
		return fmt.Errorf("bridge name %q longer than 15 bytes", b.Name)
	}
	if !LinkExists(b.Name) {
		if err := ip(ctx, "link", "add", b.Name, "type", "bridge"); err != nil && !LinkExists(b.Name) {
			return err
		}
	}
	gw := netip.PrefixFrom(b.Gateway(), b.Subnet.Bits()).String()
	out, _ := exec.CommandContext(ctx, "ip", "-o", "addr", "show", "dev", b.Name).Output()
	if !bytes.Contains(out, []byte(" "+gw+" ")) {
		if err := ip(ctx, "addr", "add", gw, "dev", b.Name); err != nil {
			return err
		}
	}
	return ip(ctx, "link", "set", b.Name, "up")
}

// EnsureGuarded is Ensure, then Guard: containers on the bridge reach no
// listener of the host but HostPorts. A node bridge of containers is
// guarded; the underlay bridge of a local cluster, which nodes use to reach
// the coordinator, is not.
func (b Bridge) EnsureGuarded(ctx context.Context) error {
	if err := b.Ensure(ctx); err != nil {
		return err
	}
	return Guard(ctx, "", b.Name, b.HostPorts)
}

// Ports lists the interfaces attached to the bridge (a container's veth
// each); none if the bridge does not exist.
func (b Bridge) Ports() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join("/sys/class/net", b.Name, "brif"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, err
}

// Delete removes the bridge and its guard. A missing bridge is not an
// error.
func (b Bridge) Delete(ctx context.Context) error {
	err := Unguard(ctx, "", b.Name)
	if LinkExists(b.Name) {
		err = errors.Join(err, ip(ctx, "link", "del", b.Name))
	}
	return err
}

// Endpoint is a container's network: a named netns with eth0 joined to a
// bridge by a veth pair.
type Endpoint struct {
	Netns  string     // netns name under /run/netns
	Veth   string     // host side of the veth pair, at most 15 bytes
	Addr   netip.Addr // eth0's address
	Bridge Bridge
	// LoAddrs are extra /32 addresses put on lo: a clone restored while the
	// original still holds Addr keeps its old address there, so sockets
	// bound to it restore, without claiming it on the bridge.
	LoAddrs []netip.Addr `json:",omitempty"`
}

// Path is the netns bind mount that runc joins.
func (e Endpoint) Path() string { return filepath.Join(NetnsDir, e.Netns) }

// Create makes the netns, brings lo up, and joins eth0 to the bridge with
// the endpoint's address and a default route through the gateway. On error
// it removes whatever it made.
func (e Endpoint) Create(ctx context.Context) (err error) {
	if len(e.Veth) > 15 {
		return fmt.Errorf("veth name %q longer than 15 bytes", e.Veth)
	}
	if _, err := os.Stat(e.Path()); err == nil {
		return fmt.Errorf("netns %s already exists", e.Netns)
	}
	if err := ip(ctx, "netns", "add", e.Netns); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = e.Delete(context.WithoutCancel(ctx))
		}
	}()
	steps := [][]string{
		{"-n", e.Netns, "link", "set", "lo", "up"},
		{"link", "add", e.Veth, "type", "veth", "peer", "name", "eth0", "netns", e.Netns},
		{"link", "set", e.Veth, "master", e.Bridge.Name, "up"},
		{"-n", e.Netns, "addr", "add", netip.PrefixFrom(e.Addr, e.Bridge.Subnet.Bits()).String(), "dev", "eth0"},
		{"-n", e.Netns, "link", "set", "eth0", "up"},
		{"-n", e.Netns, "route", "add", "default", "via", e.Bridge.Gateway().String()},
	}
	for _, a := range e.LoAddrs {
		steps = append(steps, []string{"-n", e.Netns, "addr", "add", netip.PrefixFrom(a, 32).String(), "dev", "lo"})
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			return err
		}
	}
	if len(e.LoAddrs) > 0 {
		// Answer ARP only for addresses on the asking interface, so the lo
		// addresses are never announced on the bridge.
		for _, kv := range [][2]string{{"arp_ignore", "1"}, {"arp_announce", "2"}} {
			for _, dev := range []string{"all", "eth0"} {
				if err := ip(ctx, "netns", "exec", e.Netns, "sysctl", "-q", "-w",
					fmt.Sprintf("net.ipv4.conf.%s.%s=%s", dev, kv[0], kv[1])); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Delete removes the netns and the veth pair. Missing pieces are not errors.
func (e Endpoint) Delete(ctx context.Context) error {
	var errs []error
	if LinkExists(e.Veth) {
		if err := ip(ctx, "link", "del", e.Veth); err != nil && LinkExists(e.Veth) {
			errs = append(errs, err)
		}
	}
	if _, err := os.Stat(e.Path()); err == nil {
		if err := ip(ctx, "netns", "del", e.Netns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DeviceOf returns the name of this network namespace's interface that
// holds address a: the device VXLAN of the node whose underlay address is a
// goes out of (eth0 in a simulated node; ens3, bond0 or a tunnel's wg0 on
// a real host).
func DeviceOf(a netip.Addr) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			if p, err := netip.ParsePrefix(ad.String()); err == nil && p.Addr() == a.Unmap() {
				return i.Name, nil
			}
		}
	}
	return "", fmt.Errorf("no interface of this host has the address %s", a)
}
