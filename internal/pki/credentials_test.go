package pki_test

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/pki"
)

func TestIssue(t *testing.T) {
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	serverClient := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}

	// summary is what Issue decides about a certificate.
	type summary struct {
		O, OU    []string
		CN       string
		DNS      []string
		IPs      []string
		EKU      []x509.ExtKeyUsage
		KeyUsage x509.KeyUsage
		IsCA     bool
	}
	tests := []struct {
		name     string
		node     string
		role     pki.Role
		opts     pki.IssueOptions
		want     summary
		validity time.Duration
	}{
		{
			name: "agent",
			node: "node1", role: pki.Agent,
			want:     summary{O: []string{"cairn"}, OU: []string{"agent"}, CN: "node1", DNS: []string{"node1"}, EKU: serverClient, KeyUsage: x509.KeyUsageDigitalSignature},
			validity: 365 * 24 * time.Hour,
		},
		{
			name: "coordinator with addresses",
			node: "coord", role: pki.Coordinator,
			opts: pki.IssueOptions{IPs: []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("fd00::1")}},
			want: summary{
				O: []string{"cairn"}, OU: []string{"coordinator"}, CN: "coord", DNS: []string{"coord"},
				IPs: []string{"10.0.0.1", "fd00::1"}, EKU: serverClient, KeyUsage: x509.KeyUsageDigitalSignature,
			},
			validity: 365 * 24 * time.Hour,
		},
		{
			name: "client for a week",
			node: "alice", role: pki.Client,
			opts:     pki.IssueOptions{Validity: 7 * 24 * time.Hour},
			want:     summary{O: []string{"cairn"}, OU: []string{"client"}, CN: "alice", DNS: []string{"alice"}, EKU: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature},
			validity: 7 * 24 * time.Hour,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			creds, err := ca.Issue(tc.node, tc.role, tc.opts)
			if err != nil {
				t.Fatalf("Issue: %v", err)
			}
			c := creds.Cert()
			var ips []string
			for _, ip := range c.IPAddresses {
				ips = append(ips, ip.String())
			}
			got := summary{c.Subject.Organization, c.Subject.OrganizationalUnit, c.Subject.CommonName, c.DNSNames, ips, c.ExtKeyUsage, c.KeyUsage, c.IsCA}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("certificate mismatch (-want +got):\n%s", diff)
			}
			if creds.Name != tc.node || creds.Role != tc.role || creds.ClusterID != ca.ClusterID || !creds.CA.Equal(ca.Cert) {
				t.Errorf("credentials are %s/%s of cluster %s, want %s/%s of %s", creds.Name, creds.Role, creds.ClusterID, tc.node, tc.role, ca.ClusterID)
			}
			if !approx(c.NotAfter, start.Add(tc.validity)) {
				t.Errorf("NotAfter %v, want about %v", c.NotAfter, start.Add(tc.validity))
			}
			if !c.NotBefore.Before(start) {
				t.Errorf("NotBefore %v is not before %v", c.NotBefore, start)
			}
			if err := c.CheckSignatureFrom(ca.Cert); err != nil {
				t.Errorf("not signed by the CA: %v", err)
			}
		})
	}
}

func TestIssueRefuses(t *testing.T) {
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tests := []struct {
		name    string
		node    string
		role    pki.Role
		opts    pki.IssueOptions
		wantErr error // nil: any error
	}{
		{name: "empty name", node: "", role: pki.Agent, wantErr: pki.ErrInvalidName},
		{name: "path", node: "../x", role: pki.Agent, wantErr: pki.ErrInvalidName},
		{name: "too long", node: "a234567890123456789012345678901234567890123456789012345678901234", role: pki.Agent, wantErr: pki.ErrInvalidName},
		{name: "uppercase", node: "Node1", role: pki.Agent, wantErr: pki.ErrInvalidName},
		{name: "underscore", node: "node_1", role: pki.Agent, wantErr: pki.ErrInvalidName},
		{name: "unknown role", node: "node1", role: "admin", wantErr: pki.ErrInvalidRole},
		{name: "empty role", node: "node1", role: "", wantErr: pki.ErrInvalidRole},
		{name: "negative validity", node: "node1", role: pki.Agent, opts: pki.IssueOptions{Validity: -time.Hour}},
		{name: "ends before it begins", node: "node1", role: pki.Agent, opts: pki.IssueOptions{NotBefore: now, NotAfter: now.Add(-time.Hour)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			creds, err := ca.Issue(tc.node, tc.role, tc.opts)
			if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("Issue(%q, %q) error %v, want %v", tc.node, tc.role, err, tc.wantErr)
			}
			if creds != nil {
				t.Errorf("Issue returned credentials with error %v", err)
			}
		})
	}
}

func TestIssueNeverOutlivesCA(t *testing.T) {
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range []pki.IssueOptions{{}, {NotAfter: time.Now().Add(48 * time.Hour)}} {
		creds := issue(t, ca, "node1", pki.Agent, opts)
		if !creds.Cert().NotAfter.Equal(ca.Cert.NotAfter) {
			t.Errorf("with %+v: NotAfter %v, want the CA's %v", opts, creds.Cert().NotAfter, ca.Cert.NotAfter)
		}
	}
}

func TestCredentialsWriteLoad(t *testing.T) {
	a := newCluster(t)
	dir := filepath.Join(t.TempDir(), "creds")
	if err := a.coord.Write(dir); err != nil {
		t.Fatalf("Write: %v", err)
	}
	modes := map[string]fs.FileMode{"node.crt": 0o644, "node.key": 0o600, "ca.crt": 0o644}
	for name, want := range modes {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}

	got, err := pki.LoadCredentials(dir)
	if err != nil {
		t.Fatalf("LoadCredentials: %v", err)
	}
	if got.Name != "coord" || got.Role != pki.Coordinator || got.ClusterID != a.ca.ClusterID ||
		!got.Cert().Equal(a.coord.Cert()) || !got.CA.Equal(a.ca.Cert) {
		t.Errorf("LoadCredentials gave %s/%s of cluster %s, want coord/coordinator of %s", got.Name, got.Role, got.ClusterID, a.ca.ClusterID)
	}

	// Renewal overwrites.
	renewed := issue(t, a.ca, "coord", pki.Coordinator, pki.IssueOptions{})
	if err := renewed.Write(dir); err != nil {
		t.Fatalf("Write over existing credentials: %v", err)
	}
	got, err = pki.LoadCredentials(dir)
	if err != nil {
		t.Fatalf("LoadCredentials: %v", err)
	}
	if !got.Cert().Equal(renewed.Cert()) {
		t.Error("LoadCredentials after renewal gave the old certificate")
	}
}

func TestLoadCredentialsErrors(t *testing.T) {
	a, b := newCluster(t), newCluster(t)
	bDir := t.TempDir()
	if err := b.agent.Write(bDir); err != nil {
		t.Fatal(err)
	}
	aCADir := t.TempDir()
	if _, err := pki.Init(aCADir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}

	copyFrom := func(src, name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			data, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	remove := func(name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}

	tests := []struct {
		name    string
		damage  func(t *testing.T, dir string)
		wantErr error
	}{
		{"no certificate", remove("node.crt"), pki.ErrNotFound},
		{"no key", remove("node.key"), pki.ErrNotFound},
		{"no CA", remove("ca.crt"), pki.ErrNotFound},
		{"certificate of another cluster", copyFrom(filepath.Join(bDir, "node.crt"), "node.crt"), pki.ErrWrongCluster},
		{"CA of another cluster", copyFrom(filepath.Join(bDir, "ca.crt"), "ca.crt"), pki.ErrWrongCluster},
		{"key of another node", copyFrom(filepath.Join(bDir, "node.key"), "node.key"), pki.ErrCorrupt},
		{"CA as node certificate", copyFrom(filepath.Join(bDir, "ca.crt"), "node.crt"), pki.ErrCorrupt},
		{"CA key as node key", copyFrom(filepath.Join(aCADir, "ca.key"), "node.key"), pki.ErrCorrupt},
		{"node certificate as CA", copyFrom(filepath.Join(bDir, "node.crt"), "ca.crt"), pki.ErrCorrupt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := a.agent.Write(dir); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, dir)
			creds, err := pki.LoadCredentials(dir)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("LoadCredentials error %v, want %v", err, tc.wantErr)
			}
			if creds != nil {
				t.Errorf("LoadCredentials returned credentials with error %v", err)
			}
		})
	}
}

// TestReload: credentials loaded from a directory present, after a
// renewal written there and a Reload, the new certificate at every new
// handshake, on both ends, with the same configs; anything else found
// there (another node's, an expired certificate) is refused and the one
// in use stays.
func TestReload(t *testing.T) {
	a := newCluster(t)
	coordDir, agentDir := t.TempDir(), t.TempDir()
	for dir, c := range map[string]*pki.Credentials{coordDir: a.coord, agentDir: a.agent} {
		if err := c.Write(dir); err != nil {
			t.Fatal(err)
		}
	}
	coord, err := pki.LoadCredentials(coordDir)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := pki.LoadCredentials(agentDir)
	if err != nil {
		t.Fatal(err)
	}
	server, client := pki.ServerConfig(coord), pki.ClientConfig(agent, "coord")
	shown := func() (srvSaw, cliSaw *x509.Certificate) {
		t.Helper()
		srv, cli := handshake(t, server, client)
		if srv.err != nil || cli.err != nil {
			t.Fatalf("handshake: server %v, client %v", srv.err, cli.err)
		}
		return srv.state.PeerCertificates[0], cli.state.PeerCertificates[0]
	}
	if changed, err := coord.Reload(); changed || err != nil {
		t.Fatalf("Reload of unchanged credentials: %v, %v; want false, nil", changed, err)
	}

	oldCoord, oldAgent := coord.Cert(), agent.Cert()
	for dir, old := range map[string]*x509.Certificate{coordDir: oldCoord, agentDir: oldAgent} {
		renewed, err := a.ca.Renew(old, pki.IssueOptions{Validity: 48 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if renewed.Name != mustLoad(t, dir).Name || !slices.EqualFunc(renewed.Cert().IPAddresses, old.IPAddresses, net.IP.Equal) {
			t.Fatalf("renewed %s: %+v, IPs %v, want those of the old one (%v)", dir, renewed, renewed.Cert().IPAddresses, old.IPAddresses)
		}
		if err := renewed.Write(dir); err != nil {
			t.Fatal(err)
		}
	}
	if srvSaw, cliSaw := shown(); !srvSaw.Equal(oldAgent) || !cliSaw.Equal(oldCoord) {
		t.Fatalf("before Reload, the new certificates are in use")
	}
	for _, c := range []*pki.Credentials{coord, agent} {
		if changed, err := c.Reload(); !changed || err != nil {
			t.Fatalf("Reload of renewed credentials: %v, %v; want true, nil", changed, err)
		}
	}
	srvSaw, cliSaw := shown()
	if srvSaw.Equal(oldAgent) || !srvSaw.Equal(agent.Cert()) || cliSaw.Equal(oldCoord) || !cliSaw.Equal(coord.Cert()) {
		t.Fatalf("after Reload the old certificates are still shown")
	}
	if d := time.Until(coord.Cert().NotAfter); d > 49*time.Hour || d < 47*time.Hour {
		t.Errorf("renewed certificate valid for %v, want 48h", d)
	}

	inUse := coord.Cert()
	for what, c := range map[string]*pki.Credentials{
		"another node's": a.agent,
		"expired":        issue(t, a.ca, "coord", pki.Coordinator, expired()),
	} {
		if err := c.Write(coordDir); err != nil {
			t.Fatal(err)
		}
		if changed, err := coord.Reload(); changed || err == nil {
			t.Errorf("Reload of %s credentials: %v, %v; want an error", what, changed, err)
		} else {
			t.Logf("%s: %v", what, err)
		}
		if !coord.Cert().Equal(inUse) {
			t.Fatalf("after refusing %s credentials, another certificate is in use", what)
		}
	}
	if _, err := a.ca.Renew(newCluster(t).agent.Cert(), pki.IssueOptions{}); !errors.Is(err, pki.ErrWrongCluster) {
		t.Errorf("Renew of another cluster's certificate: %v, want ErrWrongCluster", err)
	}
}

func mustLoad(t *testing.T, dir string) *pki.Credentials {
	t.Helper()
	c, err := pki.LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSignRenewal: credentials renewed by whoever holds the CA, from a
// request whose key stays with the requester: the certificate says what
// the requester's verified certificate says, whatever the request asks;
// Install puts it in use. Requests not signed by their key, peers of
// another cluster and certificates of another node are refused.
func TestSignRenewal(t *testing.T) {
	a := newCluster(t)
	dir := t.TempDir()
	if err := a.coord.Write(dir); err != nil {
		t.Fatal(err)
	}
	creds := mustLoad(t, dir)
	old := creds.Cert()
	csr, key, err := creds.RenewalRequest()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := a.ca.SignRenewal(old, csr, pki.IssueOptions{Validity: 72 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "coord" || !slices.EqualFunc(cert.IPAddresses, old.IPAddresses, net.IP.Equal) || cert.SerialNumber.Cmp(old.SerialNumber) == 0 {
		t.Fatalf("renewed: %v %v serial %v; want coord's name and IPs %v, a new serial", cert.Subject, cert.IPAddresses, cert.SerialNumber, old.IPAddresses)
	}
	if err := creds.Install(cert, key); err != nil {
		t.Fatal(err)
	}
	if !creds.Cert().Equal(cert) || !mustLoad(t, dir).Cert().Equal(cert) {
		t.Fatal("Install: the renewed certificate is not in use and on disk")
	}

	// A request that asks for another name gets the peer's all the same.
	other, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node9"}, DNSNames: []string{"node9"}}, key)
	if c, err := a.ca.SignRenewal(a.agent.Cert(), other, pki.IssueOptions{}); err != nil || c.Subject.CommonName != "node1" || len(c.DNSNames) != 1 || c.DNSNames[0] != "node1" {
		t.Errorf("a request for node9 from node1: %v %v, want node1's certificate", c, err)
	}
	tampered := slices.Clone(csr)
	tampered[len(tampered)-3] ^= 0xff
	if _, err := a.ca.SignRenewal(old, tampered, pki.IssueOptions{}); err == nil {
		t.Error("a request whose signature does not hold was signed")
	}
	if _, err := a.ca.SignRenewal(newCluster(t).agent.Cert(), csr, pki.IssueOptions{}); !errors.Is(err, pki.ErrWrongCluster) {
		t.Errorf("a peer of another cluster: %v, want ErrWrongCluster", err)
	}
	wrong, _ := a.ca.SignRenewal(a.agent.Cert(), csr, pki.IssueOptions{})
	if err := creds.Install(wrong, key); err == nil {
		t.Error("node1's certificate installed into coord's credentials")
	}
	if !creds.Cert().Equal(cert) {
		t.Error("a refused Install changed the certificate in use")
	}
}
