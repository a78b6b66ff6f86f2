package coord_test

import (
	"context"
	"crypto/x509"
	"net"
	"testing"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// TestRenewCert: a coordinator holding the CA renews an agent's
// certificate for the key of its request, with the name and addresses of
// the certificate the agent's connection presented; it refuses callers
// that are not agents, and one without the CA says so (no_ca).
func TestRenewCert(t *testing.T) {
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tc := startCoordinatorOf(t, ca, coord.Options{CA: ca})
	ctx := context.Background()
	n1, err := ca.Issue("n1", pki.Agent, pki.IssueOptions{IPs: []net.IP{net.ParseIP("192.0.2.7")}})
	if err != nil {
		t.Fatal(err)
	}
	csr, key, err := n1.RenewalRequest()
	if err != nil {
		t.Fatal(err)
	}
	co := rpc.NewCoordClient(tc.addr, n1)
	defer co.Close()
	out, err := co.RenewCert(ctx, coordv1.RenewCert{CSR: csr})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(out.Cert)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "n1" || len(cert.IPAddresses) != 1 || !cert.IPAddresses[0].Equal(net.ParseIP("192.0.2.7")) ||
		!key.PublicKey.Equal(cert.PublicKey) || cert.CheckSignatureFrom(ca.Cert) != nil {
		t.Fatalf("renewed: %v %v, want n1's name and address, the request's key, signed by the CA", cert.Subject, cert.IPAddresses)
	}

	cli := rpc.NewCoordClient(tc.addr, issue(t, ca, "alice", pki.Client))
	defer cli.Close()
	if _, err := cli.RenewCert(ctx, coordv1.RenewCert{CSR: csr}); !isCode(err, agentv1.CodeForbidden) {
		t.Errorf("a client asks for a renewal: %v, want forbidden", err)
	}
	if _, err := co.RenewCert(ctx, coordv1.RenewCert{CSR: []byte("not a request")}); !isCode(err, agentv1.CodeBadRequest) {
		t.Errorf("a request that is none: %v, want bad_request", err)
	}

	other := startCoordinator(t, coord.Options{})
	n2 := issue(t, other.ca, "n2", pki.Agent)
	csr2, _, _ := n2.RenewalRequest()
	co2 := rpc.NewCoordClient(other.addr, n2)
	defer co2.Close()
	if _, err := co2.RenewCert(ctx, coordv1.RenewCert{CSR: csr2}); !isCode(err, coordv1.CodeNoCA) {
		t.Errorf("a coordinator without the CA: %v, want no_ca", err)
	}
}
