package netw

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrExhausted is returned when a subnet has no free address left.
var ErrExhausted = errors.New("no free address in subnet")

// IPAM hands out addresses of one subnet to named owners. Its state is a
// JSON file changed under an exclusive flock, so concurrent cairn processes
// on one node never hand out one address twice.
type IPAM struct {
	Path   string       // state file; its directory must exist
	Subnet netip.Prefix // addresses handed out: gateway+1 .. broadcast-1
}

type ipamState struct {
	Subnet string            `json:"subnet"`
	Owners map[string]string `json:"owners"` // address -> owner name
}

func (m IPAM) update(fn func(owners map[string]string) error) error {
	lock, err := os.OpenFile(m.Path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", m.Path, err)
	}
	st := ipamState{Owners: map[string]string{}}
	if b, err := os.ReadFile(m.Path); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("read %s: %w", m.Path, err)
		}
		if st.Owners == nil {
			st.Owners = map[string]string{}
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	if err := fn(st.Owners); err != nil {
		return err
	}
	st.Subnet = m.Subnet.String()
	b, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return err
	}
	tmp := m.Path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, m.Path)
}

// Allocate gives owner the address want if it is free (or already owner's),
// or else, when want is invalid, the lowest free address. It returns the
// address and whether it was want.
func (m IPAM) Allocate(owner string, want netip.Addr) (netip.Addr, error) {
	var got netip.Addr
	err := m.update(func(owners map[string]string) error {
		if want.IsValid() {
			if !m.Subnet.Contains(want) {
				return fmt.Errorf("address %s is outside subnet %s", want, m.Subnet)
			}
			if o, taken := owners[want.String()]; taken && o != owner {
				return fmt.Errorf("address %s is held by %s", want, o)
			}
			owners[want.String()] = owner
			got = want
			return nil
		}
		gw := m.Subnet.Masked().Addr().Next()
		for a := gw.Next(); m.Subnet.Contains(a) && m.Subnet.Contains(a.Next()); a = a.Next() {
			if _, taken := owners[a.String()]; !taken {
				owners[a.String()] = owner
				got = a
				return nil
			}
		}
		return fmt.Errorf("%w %s", ErrExhausted, m.Subnet)
	})
	return got, err
}

// Owner returns who holds addr, or "".
func (m IPAM) Owner(addr netip.Addr) (string, error) {
	var o string
	err := m.update(func(owners map[string]string) error { o = owners[addr.String()]; return nil })
	return o, err
}

// Release frees every address owner holds.
func (m IPAM) Release(owner string) error {
	return m.update(func(owners map[string]string) error {
		for a, o := range owners {
			if o == owner {
				delete(owners, a)
			}
		}
		return nil
	})
}

// DefaultStatePath is the IPAM file inside a data dir.
func DefaultStatePath(dataDir string) string { return filepath.Join(dataDir, "net", "ipam.json") }
