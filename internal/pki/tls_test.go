package pki_test

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/pki"
)

func TestHandshake(t *testing.T) {
	a := newCluster(t)
	dir := filepath.Join(t.TempDir(), "node1")
	if err := a.agent.Write(dir); err != nil {
		t.Fatalf("Write: %v", err)
	}
	loaded, err := pki.LoadCredentials(dir)
	if err != nil {
		t.Fatalf("LoadCredentials: %v", err)
	}
	id := func(name string, role pki.Role) pki.Identity {
		return pki.Identity{Name: name, Role: role, ClusterID: a.ca.ClusterID}
	}

	tests := []struct {
		name           string
		server, client *tls.Config
		// What each side sees of the other.
		serverSees, clientSees pki.Identity
	}{
		{
			name:       "agent to coordinator",
			server:     pki.ServerConfig(a.coord),
			client:     pki.ClientConfig(a.agent, "coord"),
			serverSees: id("node1", pki.Agent),
			clientSees: id("coord", pki.Coordinator),
		},
		{
			name:       "coordinator to agent",
			server:     pki.ServerConfig(a.agent),
			client:     pki.ClientConfig(a.coord, "node1"),
			serverSees: id("coord", pki.Coordinator),
			clientSees: id("node1", pki.Agent),
		},
		{
			name:       "cli to coordinator",
			server:     pki.ServerConfig(a.coord),
			client:     pki.ClientConfig(a.cli, "coord"),
			serverSees: id("cli", pki.Client),
			clientSees: id("coord", pki.Coordinator),
		},
		{
			name:       "coordinator by IP address",
			server:     pki.ServerConfig(a.coord),
			client:     pki.ClientConfig(a.agent, "127.0.0.1"),
			serverSees: id("node1", pki.Agent),
			clientSees: id("coord", pki.Coordinator),
		},
		{
			name:       "credentials loaded from disk",
			server:     pki.ServerConfig(a.coord),
			client:     pki.ClientConfig(loaded, "coord"),
			serverSees: id("node1", pki.Agent),
			clientSees: id("coord", pki.Coordinator),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli := handshake(t, tc.server, tc.client)
			if srv.err != nil || cli.err != nil {
				t.Fatalf("handshake: server error %v, client error %v", srv.err, cli.err)
			}
			for _, s := range []struct {
				who   string
				state tls.ConnectionState
				want  pki.Identity
			}{{"server", srv.state, tc.serverSees}, {"client", cli.state, tc.clientSees}} {
				if s.state.Version != tls.VersionTLS13 {
					t.Errorf("%s: TLS version %#x, want TLS 1.3", s.who, s.state.Version)
				}
				got, err := pki.PeerIdentity(s.state)
				if err != nil {
					t.Errorf("%s: PeerIdentity: %v", s.who, err)
					continue
				}
				if diff := cmp.Diff(s.want, got); diff != "" {
					t.Errorf("%s: PeerIdentity mismatch (-want +got):\n%s", s.who, diff)
				}
			}
		})
	}
}

func TestHandshakeRefused(t *testing.T) {
	a, b := newCluster(t), newCluster(t)
	expiredAgent := issue(t, a.ca, "node2", pki.Agent, expired())
	expiredCoord := issue(t, a.ca, "coord", pki.Coordinator, expired())

	noCert := pki.ClientConfig(a.agent, "coord")
	noCert.GetClientCertificate = nil
	tls12 := pki.ClientConfig(a.agent, "coord")
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	// A server that, by a caller's mistake, also trusts cluster b's CA:
	// the cluster check after verification must still refuse b's nodes.
	twoCAs := pki.ServerConfig(a.coord)
	twoCAs.ClientCAs.AddCert(b.ca.Cert)
	// A node of cluster b that trusts a's CA, to get as far as showing
	// its certificate to a's server.
	intruder := pki.ClientConfig(b.agent, "coord")
	intruder.RootCAs = x509.NewCertPool()
	intruder.RootCAs.AddCert(a.ca.Cert)
	intruder.VerifyConnection = nil
	// Its GetClientCertificate shows b's certificate even though a's
	// server asks for one of a's CA.

	unknownAuthority := func(err error) bool {
		var e x509.UnknownAuthorityError
		return errors.As(err, &e)
	}
	invalid := func(reason x509.InvalidReason) func(error) bool {
		return func(err error) bool {
			var e x509.CertificateInvalidError
			return errors.As(err, &e) && e.Reason == reason
		}
	}
	hostname := func(err error) bool {
		var e x509.HostnameError
		return errors.As(err, &e)
	}
	contains := func(s string) func(error) bool {
		return func(err error) bool { return strings.Contains(err.Error(), s) }
	}
	is := func(target error) func(error) bool {
		return func(err error) bool { return errors.Is(err, target) }
	}

	tests := []struct {
		name           string
		server, client *tls.Config
		// verifier is the side that refuses ("server" or "client"); its
		// error must satisfy want. The other side must fail too.
		verifier string
		want     func(error) bool
	}{
		{
			name:     "client without certificate",
			server:   pki.ServerConfig(a.coord),
			client:   noCert,
			verifier: "server",
			want:     contains("didn't provide a certificate"),
		},
		{
			name:     "client of another cluster",
			server:   pki.ServerConfig(a.coord),
			client:   intruder,
			verifier: "server",
			want:     unknownAuthority,
		},
		{
			name:     "server of another cluster",
			server:   pki.ServerConfig(b.coord),
			client:   pki.ClientConfig(a.agent, "coord"),
			verifier: "client",
			want:     unknownAuthority,
		},
		{
			name:     "client of another cluster past verification",
			server:   twoCAs,
			client:   intruder,
			verifier: "server",
			want:     is(pki.ErrWrongCluster),
		},
		{
			name:     "expired client certificate",
			server:   pki.ServerConfig(a.coord),
			client:   pki.ClientConfig(expiredAgent, "coord"),
			verifier: "server",
			want:     invalid(x509.Expired),
		},
		{
			name:     "expired server certificate",
			server:   pki.ServerConfig(expiredCoord),
			client:   pki.ClientConfig(a.agent, "coord"),
			verifier: "client",
			want:     invalid(x509.Expired),
		},
		{
			name:     "server certificate for another name",
			server:   pki.ServerConfig(a.coord),
			client:   pki.ClientConfig(a.agent, "node1"),
			verifier: "client",
			want:     hostname,
		},
		{
			name:     "server certificate for another address",
			server:   pki.ServerConfig(a.coord),
			client:   pki.ClientConfig(a.agent, "127.0.0.2"),
			verifier: "client",
			want:     hostname,
		},
		{
			name:     "cli certificate cannot serve",
			server:   pki.ServerConfig(a.cli),
			client:   pki.ClientConfig(a.agent, "cli"),
			verifier: "client",
			want:     invalid(x509.IncompatibleUsage),
		},
		{
			name:     "TLS 1.2 client",
			server:   pki.ServerConfig(a.coord),
			client:   tls12,
			verifier: "server",
			want:     contains("unsupported versions"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli := handshake(t, tc.server, tc.client)
			if srv.err == nil || cli.err == nil {
				t.Fatalf("handshake: server error %v, client error %v; want both to fail", srv.err, cli.err)
			}
			got := srv.err
			if tc.verifier == "client" {
				got = cli.err
			}
			if !tc.want(got) {
				t.Errorf("%s error: %v; not the expected refusal", tc.verifier, got)
			}
			if _, err := pki.PeerIdentity(srv.state); !errors.Is(err, pki.ErrUnauthenticated) {
				t.Errorf("server: PeerIdentity error %v, want ErrUnauthenticated", err)
			}
		})
	}
}

func TestPeerIdentity(t *testing.T) {
	a := newCluster(t)
	caCert := func(subject pkix.Name) *x509.Certificate {
		return &x509.Certificate{Subject: subject, IsCA: true, BasicConstraintsValid: true}
	}
	leaf := func(cn string, ou ...string) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{Organization: []string{"cairn"}, OrganizationalUnit: ou, CommonName: cn}}
	}
	cairnCA := caCert(a.ca.Cert.Subject)
	state := func(chain ...*x509.Certificate) tls.ConnectionState {
		return tls.ConnectionState{HandshakeComplete: true, VerifiedChains: [][]*x509.Certificate{chain}}
	}

	tests := []struct {
		name    string
		state   tls.ConnectionState
		want    pki.Identity
		wantErr error
	}{
		{
			name:  "issued credentials",
			state: state(a.agent.Cert(), a.agent.CA),
			want:  pki.Identity{Name: "node1", Role: pki.Agent, ClusterID: a.ca.ClusterID},
		},
		{
			name:  "coordinator",
			state: state(leaf("c", "coordinator"), cairnCA),
			want:  pki.Identity{Name: "c", Role: pki.Coordinator, ClusterID: a.ca.ClusterID},
		},
		{name: "no connection", state: tls.ConnectionState{}, wantErr: pki.ErrUnauthenticated},
		{
			name: "handshake not complete",
			state: tls.ConnectionState{
				VerifiedChains: [][]*x509.Certificate{{a.agent.Cert(), a.agent.CA}},
			},
			wantErr: pki.ErrUnauthenticated,
		},
		{
			name: "certificates not verified",
			state: tls.ConnectionState{
				HandshakeComplete: true,
				PeerCertificates:  []*x509.Certificate{a.agent.Cert()},
			},
			wantErr: pki.ErrUnauthenticated,
		},
		{name: "leaf alone", state: state(a.agent.Cert()), wantErr: pki.ErrUnauthenticated},
		{
			name:    "intermediate CA",
			state:   state(a.agent.Cert(), cairnCA, cairnCA),
			wantErr: pki.ErrUnauthenticated,
		},
		{
			name:    "foreign CA",
			state:   state(leaf("n", "agent"), caCert(pkix.Name{Organization: []string{"acme"}, CommonName: "acme root"})),
			wantErr: pki.ErrUnauthenticated,
		},
		{
			name:    "CA without cluster id",
			state:   state(leaf("n", "agent"), caCert(pkix.Name{Organization: []string{"cairn"}, CommonName: "cairn cluster ../x"})),
			wantErr: pki.ErrUnauthenticated,
		},
		{name: "unknown role", state: state(leaf("n", "admin"), cairnCA), wantErr: pki.ErrUnauthenticated},
		{name: "two roles", state: state(leaf("n", "agent", "coordinator"), cairnCA), wantErr: pki.ErrUnauthenticated},
		{name: "no role", state: state(leaf("n"), cairnCA), wantErr: pki.ErrUnauthenticated},
		{name: "invalid name", state: state(leaf("../x", "agent"), cairnCA), wantErr: pki.ErrUnauthenticated},
		{name: "leaf is a CA", state: state(cairnCA, cairnCA), wantErr: pki.ErrUnauthenticated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pki.PeerIdentity(tc.state)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("PeerIdentity error %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("PeerIdentity mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestServerConfigOptionalCert: a server that takes callers without a
// certificate still verifies every certificate it is shown; such a caller
// has no identity.
func TestServerConfigOptionalCert(t *testing.T) {
	a, b := newCluster(t), newCluster(t)
	server := pki.ServerConfigOptionalCert(a.coord)

	noCert := pki.ClientConfig(a.cli, "coord")
	noCert.GetClientCertificate = nil
	srv, cli := handshake(t, server, noCert)
	if srv.err != nil || cli.err != nil {
		t.Fatalf("no certificate: server %v, client %v; want a connection", srv.err, cli.err)
	}
	if _, err := pki.PeerIdentity(srv.state); !errors.Is(err, pki.ErrUnauthenticated) {
		t.Fatalf("identity of a caller without a certificate: %v, want ErrUnauthenticated", err)
	}

	srv, cli = handshake(t, server, pki.ClientConfig(a.cli, "coord"))
	if srv.err != nil || cli.err != nil {
		t.Fatalf("client: server %v, client %v", srv.err, cli.err)
	}
	if id, err := pki.PeerIdentity(srv.state); err != nil || id.Name != "cli" || id.Role != pki.Client {
		t.Fatalf("identity of the client: %+v %v", id, err)
	}

	// Another cluster's node that trusts a's CA is still refused.
	intruder := pki.ClientConfig(b.agent, "coord")
	intruder.RootCAs = x509.NewCertPool()
	intruder.RootCAs.AddCert(a.ca.Cert)
	intruder.VerifyConnection = nil
	srv, _ = handshake(t, server, intruder)
	var unknown x509.UnknownAuthorityError
	if !errors.As(srv.err, &unknown) {
		t.Fatalf("another cluster's certificate: server %v, want an unknown authority", srv.err)
	}
}
