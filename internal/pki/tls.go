package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

var (
	// ErrUnauthenticated is returned by [PeerIdentity] when the peer did not
	// present a certificate that was verified against a cairn cluster CA,
	// or presented one that is not a well-formed cairn leaf.
	ErrUnauthenticated = errors.New("peer not authenticated")
	// ErrWrongCluster is returned when a certificate belongs to another
	// cluster than the one expected: by [LoadCredentials] for a node.crt
	// not signed by the ca.crt beside it, and by the handshake of
	// [ServerConfig] and [ClientConfig] for a peer of another cluster that
	// got past certificate verification (only possible if a caller added
	// another CA to the config's pools).
	ErrWrongCluster = errors.New("certificate of another cluster")
)

// Identity is who is at the other end of a verified connection.
type Identity struct {
	Name      string
	Role      Role
	ClusterID string
}

// ServerConfig returns the TLS configuration for a server (the coordinator
// or an agent) holding creds: TLS 1.3 only, creds' certificate (the one
// in use at each handshake: see [Credentials.Reload]), and a
// client certificate required and verified against the cluster CA alone.
// The caller may read the client's [Identity] with [PeerIdentity] once the
// handshake is done.
func ServerConfig(creds *Credentials) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		MaxVersion:             tls.VersionTLS13,
		GetCertificate:         func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return creds.tlsCertificate(), nil },
		ClientAuth:             tls.RequireAndVerifyClientCert,
		ClientCAs:              creds.pool(),
		SessionTicketsDisabled: true,
		VerifyConnection:       verifyPeer(creds.ClusterID),
	}
}

// ServerConfigOptionalCert is [ServerConfig] for a server that also takes
// callers without a client certificate (a scraper with a bearer token): a
// certificate that is presented is verified all the same, and the server
// must authenticate each request of a caller without one otherwise, or
// refuse it ([PeerIdentity] gives such a caller an error).
func ServerConfigOptionalCert(creds *Credentials) *tls.Config {
	c := ServerConfig(creds)
	c.ClientAuth = tls.VerifyClientCertIfGiven
	verify := c.VerifyConnection
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return nil
		}
		return verify(cs)
	}
	return c
}

// ClientConfig returns the TLS configuration for a client holding creds
// that connects to the server named serverName (a name or an IP address,
// checked against the server certificate's SANs): TLS 1.3 only, creds'
// certificate presented, and the server verified against the cluster CA
// alone, never the system roots.
func ClientConfig(creds *Credentials, serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return creds.tlsCertificate(), nil
		},
		RootCAs:          creds.pool(),
		ServerName:       serverName,
		VerifyConnection: verifyPeer(creds.ClusterID),
	}
}

func (c *Credentials) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.CA)
	return p
}

// verifyPeer returns a tls.Config.VerifyConnection that refuses a peer
// without a well-formed cairn identity in cluster clusterID. It runs after
// the standard chain verification and only adds to it.
func verifyPeer(clusterID string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		id, err := chainIdentity(cs.VerifiedChains)
		if err != nil {
			return err
		}
		if id.ClusterID != clusterID {
			return fmt.Errorf("%w: peer %s (%s) is in cluster %s, not %s", ErrWrongCluster, id.Name, id.Role, id.ClusterID, clusterID)
		}
		return nil
	}
}

// PeerIdentity returns the identity of the peer of a connection configured
// by [ServerConfig] or [ClientConfig], once its handshake is complete: the
// name and role in its verified leaf certificate and the cluster id of the
// CA it chains to. Anything else (a handshake not done or failed, no
// certificate, an unverified one, one that is not a cairn leaf directly
// under a cairn CA) gives an error wrapping [ErrUnauthenticated].
func PeerIdentity(state tls.ConnectionState) (Identity, error) {
	if !state.HandshakeComplete {
		return Identity{}, fmt.Errorf("%w: TLS handshake not complete", ErrUnauthenticated)
	}
	return chainIdentity(state.VerifiedChains)
}

// chainIdentity reads the identity in the first of the verified chains.
func chainIdentity(chains [][]*x509.Certificate) (Identity, error) {
	if len(chains) == 0 {
		return Identity{}, fmt.Errorf("%w: no verified peer certificate", ErrUnauthenticated)
	}
	chain := chains[0]
	if len(chain) != 2 {
		return Identity{}, fmt.Errorf("%w: chain of %d certificates, want a leaf and the cluster CA", ErrUnauthenticated, len(chain))
	}
	clusterID, err := caClusterID(chain[1])
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
	}
	name, role, err := leafIdentity(chain[0])
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
	}
	return Identity{Name: name, Role: role, ClusterID: clusterID}, nil
}
