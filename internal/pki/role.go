package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
)

// ErrInvalidRole is returned for a role that is not [Agent], [Coordinator]
// or [Client].
var ErrInvalidRole = errors.New("invalid role")

// Role is what a leaf certificate is for. Its value is the certificate's OU.
type Role string

// The roles. Agents and the coordinator both serve and call; the CLI only
// calls.
const (
	Agent       Role = "agent"
	Coordinator Role = "coordinator"
	Client      Role = "client"
)

// ParseRole returns the Role named s ("agent", "coordinator" or "client").
// The error wraps [ErrInvalidRole].
func ParseRole(s string) (Role, error) {
	r := Role(s)
	if !r.valid() {
		return "", fmt.Errorf("%w: %q; want %q, %q or %q", ErrInvalidRole, s, Agent, Coordinator, Client)
	}
	return r, nil
}

func (r Role) valid() bool {
	switch r {
	case Agent, Coordinator, Client:
		return true
	}
	return false
}

// extKeyUsage returns what a certificate of role r may be used for.
func (r Role) extKeyUsage() []x509.ExtKeyUsage {
	if r == Client {
		return []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
}
